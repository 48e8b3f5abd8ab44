//! The spec's grid and `generate_topk_idx` (`spec/moe.md` §3.2): the 12 moe12 configurations
//! in upstream's order, the full grid's extra entries, and the generator's properties
//! (range, distinct ids per row, no all-`-1` rows, determinism, row count near its expectation).
#![cfg(feature = "cpu")]

use tk_core::testing::Rng;
use tk_moe::testing::{generate_moe_params_with, generate_topk_idx, MoeParams};

#[test]
fn moe12_configs_in_order() {
    let g = generate_moe_params_with(false, false);
    let got: Vec<(usize, usize, usize)> = g
        .iter()
        .map(|p| (p.num_topk, p.global_experts(), p.num_ep_ranks))
        .collect();
    let mut want = Vec::new();
    for k in [2, 6, 8, 9] {
        want.extend([(k, 72, 8), (k, 256, 8), (k, 256, 64)]);
    }
    assert_eq!(got, want);
    assert!(g.iter().all(|p| p.num_send_tokens == 4001));
    assert_eq!(generate_moe_params_with(true, false), g);
}

#[test]
fn full_grid() {
    let g = generate_moe_params_with(false, true);
    assert_eq!(
        g[0],
        MoeParams {
            num_send_tokens: 0,
            num_topk: 1,
            num_experts: 1,
            num_ep_ranks: 1
        }
    );
    // 6 K × (72: ep 8, 1, 72 | 256: 8, 64, 1, 256 | 288: 8, 1, 72 | 384: 8, 64, 1) = 6 × 13.
    assert_eq!(g.len(), 1 + 6 * 13);
    assert!(g
        .iter()
        .any(|p| p.num_topk == 7 && p.global_experts() == 384 && p.num_ep_ranks == 1));
    assert_eq!(generate_moe_params_with(true, true).len(), 6 * 13);
}

#[test]
fn generator_properties() {
    for p in generate_moe_params_with(false, false) {
        let small = MoeParams {
            num_send_tokens: 300,
            ..p
        };
        let a = generate_topk_idx(&mut Rng::new(7), &small).unwrap();
        let b = generate_topk_idx(&mut Rng::new(7), &small).unwrap();
        assert_eq!(a, b, "deterministic");
        let (t, k) = (a.shape()[0], a.shape()[1]);
        assert_eq!(k, p.num_topk);
        let mut valid = 0usize;
        for row in a.as_slice().chunks(k) {
            assert!(row.iter().all(|&v| v >= -1 && v < p.num_experts as i64));
            assert!(row.iter().any(|&v| v >= 0), "all -1 row kept");
            let mut ids: Vec<i64> = row.iter().copied().filter(|&v| v >= 0).collect();
            valid += ids.len();
            ids.sort();
            ids.dedup();
            assert_eq!(
                ids.len(),
                row.iter().filter(|&&v| v >= 0).count(),
                "duplicate id"
            );
        }
        // Expected valid entries: 300·K; expected rows from the spec's formula.
        let expect_valid = 300.0 * k as f64;
        assert!(
            (valid as f64 - expect_valid).abs() < 0.15 * expect_valid,
            "{} valid {valid}",
            p.name()
        );
        let (g, e) = (p.global_experts() as f64, p.num_experts as f64);
        let none = (0..k)
            .map(|i| (g - e - i as f64) / (g - i as f64))
            .product::<f64>();
        let expect_t = 300.0 * p.num_ep_ranks as f64 * (1.0 - none);
        assert!(
            (t as f64 - expect_t).abs() < 0.15 * expect_t,
            "{}: T' {t} vs {expect_t}",
            p.name()
        );
    }
    let zero = MoeParams {
        num_send_tokens: 0,
        num_topk: 1,
        num_experts: 1,
        num_ep_ranks: 1,
    };
    assert_eq!(
        generate_topk_idx(&mut Rng::new(1), &zero).unwrap().shape(),
        &[0, 1]
    );
    let bad = MoeParams {
        num_send_tokens: 1,
        num_topk: 5,
        num_experts: 2,
        num_ep_ranks: 2,
    };
    assert!(generate_topk_idx(&mut Rng::new(1), &bad).is_err());
}
