//! CPU lossless FP4 → FP8 requantization (`spec/quant.md` §3.4): its own algorithm, in
//! integer exponent space (no generic cast involved). See [`crate::per_block_cast_lossless`](mod@crate::per_block_cast_lossless)
//! for the algorithm, the preconditions (static and data-dependent) and the deviations from
//! upstream.

use tk_core::convert::e4m3_from_f32;
use tk_core::{Result, TkError};

use crate::per_block_cast_lossless::{
    input_exponent, output_exponent, validate, LosslessCastParams, MAX_EXPONENT_SPREAD,
};
use crate::scale::HostScales;
use crate::types::{CastFormat, QuantData, QuantInput};

/// `2^d` as fp32 from its exponent field (`-126 <= d <= 127`).
fn pow2(d: i32) -> f32 {
    debug_assert!((-126..=127).contains(&d));
    f32::from_bits(((d + 127) as u32) << 23)
}

/// `per_block_cast_lossless(x, 'e4m3', x_block_size, out_block_size, col, round_sf, packed)`:
/// e4m3 data `(M, K)` (contiguous) and power-of-two scales, grid `(ceil(M/oh), ceil(K/ow))` in
/// the layout `params.opts` selects, such that every value dequantizes exactly as before.
///
/// `x` is packed e2m1 `(M, K/2)` (any row stride) with scales for `x.block = (ih, iw)`.
///
/// Errors: the static ones of [`crate::per_block_cast_lossless::validate`], then, naming
/// `x.sf` ([`TkError::Param`]): an input scale that is not a positive normal power of two; an
/// input block more than `2^11` below the largest input scale of its output block (upstream's
/// device assertion); an output block with `E_max <= 6` (scale 0.0) holding a nonzero value.
pub fn per_block_cast_lossless(
    x: &QuantInput<'_>,
    params: &LosslessCastParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, params)?;
    let (m, k) = (plan.output.m, plan.output.k);
    let (ih, iw) = plan.input.block;
    let (oh, ow) = plan.output.block;
    let (in_grid, out_grid) = (plan.input.grid, plan.output.grid);
    let (in_nbm, in_nbk) = (in_grid.nbm(), in_grid.nbk());

    // Step 1: the input exponents E_in.
    let mut e_in = vec![0u32; in_nbm * in_nbk];
    for mb in 0..in_nbm {
        for kb in 0..in_nbk {
            // In range: the scale tensor's shape was checked against the grid.
            let s = x.sf.get(mb, kb).unwrap_or(f32::NAN);
            e_in[mb * in_nbk + kb] = input_exponent(s).ok_or_else(|| {
                TkError::param(
                    "x.sf",
                    format!(
                        "S[{mb}, {kb}] = {s:e} (bits {:#010x}) is not a positive normal power \
                         of two (2^-126 ..= 2^127, UE8M0 bytes 1..=254); the lossless cast \
                         works on scale exponents only, so it would not reproduce the \
                         dequantized values (upstream silently uses the exponent field)",
                        s.to_bits()
                    ),
                )
            })?;
        }
    }

    // The decoded FP4 values, row-major (M, K).
    let mut vals = Vec::with_capacity(m * k);
    for r in 0..m {
        x.data.push_decoded_row(r, &mut vals);
    }

    // Steps 2–3 per output block, with the data-dependent checks.
    let (rh, rw) = (oh / ih, ow / iw);
    let (out_nbm, out_nbk) = (out_grid.nbm(), out_grid.nbk());
    let mut e_out = vec![0u32; out_nbm * out_nbk];
    for mo in 0..out_nbm {
        for ko in 0..out_nbk {
            let in_rows = mo * rh..((mo + 1) * rh).min(in_nbm);
            let in_cols = ko * rw..((ko + 1) * rw).min(in_nbk);
            let blocks = || {
                in_rows
                    .clone()
                    .flat_map(|mb| in_cols.clone().map(move |kb| (mb, kb)))
            };
            let e_max = blocks()
                .map(|(mb, kb)| e_in[mb * in_nbk + kb])
                .max()
                .unwrap_or(0);
            let eo = output_exponent(e_max);
            if let Some((mb, kb)) = blocks().find(|&(mb, kb)| e_in[mb * in_nbk + kb] + 5 < eo) {
                let e = e_in[mb * in_nbk + kb];
                return Err(TkError::param(
                    "x.sf",
                    format!(
                        "input block ({mb}, {kb}) has scale 2^{} but output block ({mo}, {ko}) \
                         holds an input scale 2^{}: more than 2^{MAX_EXPONENT_SPREAD} apart, \
                         which FP8 e4m3 cannot hold exactly (upstream's kernel traps on a \
                         device assertion). All-zero FP4 blocks (scale 2^-126) among large \
                         values cause this; use a smaller out_block_size",
                        e as i32 - 127,
                        e_max as i32 - 127
                    ),
                ));
            }
            if eo == 0 {
                let rows = mo * oh..((mo + 1) * oh).min(m);
                let cols = ko * ow..((ko + 1) * ow).min(k);
                let nonzero = rows
                    .flat_map(|r| vals[r * k + cols.start..r * k + cols.end].iter())
                    .any(|&v| v != 0.0);
                if nonzero {
                    return Err(TkError::param(
                        "x.sf",
                        format!(
                            "output block ({mo}, {ko}): its largest input scale is 2^{} <= \
                             2^-121, so the output scale exponent E_max - 6 saturates to 0 \
                             (scale 0.0) and the block's nonzero values would be lost \
                             (upstream writes 0.0 silently)",
                            e_max as i32 - 127
                        ),
                    ));
                }
            }
            e_out[mo * out_nbk + ko] = eo;
        }
    }

    // Step 4: out = enc8(fl(dec4 · 2^(E_in − E_out))), exact.
    let codes: Vec<u8> = vals
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (r, c) = (i / k, i % k);
            let ei = e_in[(r / ih) * in_nbk + c / iw] as i32;
            let eo = e_out[(r / oh) * out_nbk + c / ow] as i32;
            e4m3_from_f32(v * pow2(ei - eo))
        })
        .collect();
    let data = QuantData::from_codes(CastFormat::E4M3, m, k, &codes)?;

    // Step 5: the scales, bits E_out << 23 (UE8M0 byte E_out).
    let mut scales = HostScales::zeros(plan.output.sf_layout, out_grid);
    for (i, &eo) in e_out.iter().enumerate() {
        scales.set(i / out_nbk, i % out_nbk, f32::from_bits(eo << 23));
    }
    Ok((data, scales))
}
