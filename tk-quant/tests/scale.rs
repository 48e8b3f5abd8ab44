//! Scale machinery (`spec/quant.md` §1.4–§1.5): option validation, grid geometry, the exact
//! storage of layouts A, B and C (padding included), UE8M0 decoding, and the reader rules for
//! input scale tensors.

mod common;

use common::{assert_param, err_arg};
use tk_core::dtype::Ue8m0x4;
use tk_core::{DType, HostView, Layout, TkError};
use tk_quant::scale::detect_scale_layout;
use tk_quant::{HostScales, ScaleGrid, ScaleLayout, ScaleOptions, ScaleView};

fn opts(round_sf: bool, col: bool, packed: bool) -> ScaleOptions {
    ScaleOptions {
        round_sf,
        use_tma_aligned_col_major_sf: col,
        use_packed_ue8m0: packed,
    }
}

#[test]
fn options_select_layouts_and_reject_bad_packing() {
    use ScaleLayout::*;
    for round in [false, true] {
        assert_eq!(opts(round, false, false).layout().unwrap(), RowMajorF32);
        assert_eq!(opts(round, true, false).layout().unwrap(), ColMajorF32);
    }
    assert_eq!(opts(true, true, true).layout().unwrap(), PackedUe8m0);
    assert_eq!(ScaleOptions::default().layout().unwrap(), RowMajorF32);
    assert_eq!(ScaleOptions::row_major(true), opts(true, false, false));
    assert_eq!(ScaleOptions::col_major(false), opts(false, true, false));
    assert_eq!(ScaleOptions::packed_ue8m0(), opts(true, true, true));
    // Packed without round_sf: names the flag and the fix.
    assert_param(
        opts(false, true, true).layout().unwrap_err(),
        "use_packed_ue8m0",
        &["round_sf = true", "clear use_packed_ue8m0"],
    );
    // Packed without column-major.
    assert_param(
        opts(true, false, true).layout().unwrap_err(),
        "use_packed_ue8m0",
        &[
            "use_tma_aligned_col_major_sf = true",
            "clear use_packed_ue8m0",
        ],
    );
    // Neither.
    assert_param(
        opts(false, false, true).layout().unwrap_err(),
        "use_packed_ue8m0",
        &["round_sf", "use_tma_aligned_col_major_sf"],
    );
    assert_eq!(ScaleLayout::RowMajorF32.dtype(), DType::F32);
    assert_eq!(ScaleLayout::ColMajorF32.dtype(), DType::F32);
    assert_eq!(ScaleLayout::PackedUe8m0.dtype(), DType::UE8M0x4);
    assert!(
        !RowMajorF32.is_col_major() && ColMajorF32.is_col_major() && PackedUe8m0.is_col_major()
    );
    assert!(PackedUe8m0.is_packed() && !ColMajorF32.is_packed());
}

#[test]
fn grid_geometry_per_layout() {
    use ScaleLayout::*;
    // M = 5, K = 10, block (2, 4): nbm = 3, nbk = 3 (both partial at the edge).
    let g = ScaleGrid::for_matrix(5, 10, (2, 4)).unwrap();
    assert_eq!(
        (g.nbm(), g.nbk(), g.rows_aligned(), g.packed_cols()),
        (3, 3, 4, 1)
    );
    assert_eq!(g.shape(RowMajorF32), [3, 3]);
    assert_eq!(g.strides(RowMajorF32), [3, 1]);
    assert_eq!(g.storage_shape(RowMajorF32), [3, 3]);
    assert_eq!(g.shape(ColMajorF32), [3, 3]);
    assert_eq!(g.strides(ColMajorF32), [1, 4]);
    assert_eq!(g.storage_shape(ColMajorF32), [3, 4]);
    assert_eq!(g.storage_len(ColMajorF32), 12);
    assert_eq!(g.shape(PackedUe8m0), [3, 1]);
    assert_eq!(g.strides(PackedUe8m0), [1, 4]);
    assert_eq!(g.storage_shape(PackedUe8m0), [1, 4]);
    // Per-token, K = 576, npc = 128: 5 groups, the last one partial.
    let g = ScaleGrid::for_matrix(4001, 576, (1, 128)).unwrap();
    assert_eq!(
        (g.nbm(), g.nbk(), g.rows_aligned(), g.packed_cols()),
        (4001, 5, 4004, 2)
    );
    assert_eq!(g.strides(PackedUe8m0), [1, 4004]);
    // uint8 allocation (ceil(nbk/4), align(4·nbm, 16)) = int32 (ceil(nbk/4), align(nbm, 4)).
    assert_eq!(g.storage_shape(PackedUe8m0), [2, 4004]);
    assert_eq!(
        4 * g.storage_shape(PackedUe8m0)[1],
        (4 * 4001usize).next_multiple_of(16)
    );
    // Layout C byte address: 4·((kb/4)·align(nbm,4) + mb) + kb%4.
    let g = ScaleGrid::new(5, 7).unwrap();
    assert_eq!(g.packed_byte_offset(0, 0), 0);
    assert_eq!(g.packed_byte_offset(0, 3), 3);
    assert_eq!(g.packed_byte_offset(1, 0), 4);
    assert_eq!(g.packed_byte_offset(2, 6), 4 * (8 + 2) + 2);
    assert_eq!(g.storage_index(PackedUe8m0, 2, 6), 10);
    assert_eq!(g.storage_index(ColMajorF32, 2, 6), 50);
    assert_eq!(g.storage_index(RowMajorF32, 2, 6), 20);
    // Empty grids: column-major strides are (1, 1), as PyTorch reports them.
    let g = ScaleGrid::for_matrix(0, 300, (1, 128)).unwrap();
    assert_eq!((g.nbm(), g.nbk()), (0, 3));
    assert_eq!(g.strides(ColMajorF32), [1, 1]);
    assert_eq!(g.shape(PackedUe8m0), [0, 1]);
    assert_eq!(g.storage_len(PackedUe8m0), 0);
    let l = g.tensor_layout(RowMajorF32);
    assert_eq!(
        (l.shape(), l.strides()),
        (&[0usize, 3][..], &[3usize, 1][..])
    );
    // Rejections.
    for block in [(0, 4), (4, 0)] {
        let e = ScaleGrid::for_matrix(8, 8, block).unwrap_err();
        assert_param(e, "block_size", &["at least 1"]);
    }
    assert_param(
        ScaleGrid::new(usize::MAX, 1).unwrap_err(),
        "scale grid",
        &["overflow"],
    );
    assert_param(
        ScaleGrid::new(1 << 40, 1 << 40).unwrap_err(),
        "scale grid",
        &["overflow"],
    );
}

/// S[mb, kb] = 2^(10·mb + kb): UE8M0 byte 127 + 10·mb + kb.
fn pow2_grid(layout: ScaleLayout, nbm: usize, nbk: usize) -> HostScales {
    HostScales::from_fn(layout, ScaleGrid::new(nbm, nbk).unwrap(), |mb, kb| {
        2f32.powi((10 * mb + kb) as i32)
    })
    .unwrap()
}

#[test]
fn layout_c_exact_bytes() {
    let s = pow2_grid(ScaleLayout::PackedUe8m0, 3, 5);
    assert_eq!(s.shape(), [3, 2]);
    assert_eq!(s.strides(), [1, 4]);
    #[rustfmt::skip]
    let expected: [u8; 32] = [
        // int32 column 0 (kb 0..3), rows 0..3; row 3 is padding
        127, 128, 129, 130,   137, 138, 139, 140,   147, 148, 149, 150,   0, 0, 0, 0,
        // int32 column 1 (kb 4..7): only byte 0 (kb 4) is real
        131, 0, 0, 0,         141, 0, 0, 0,         151, 0, 0, 0,         0, 0, 0, 0,
    ];
    assert_eq!(s.storage_bytes(), expected);
    assert_eq!(
        s.packed_storage().unwrap()[0],
        Ue8m0x4(0x8281_807F_u32 as i32)
    );
    for mb in 0..3 {
        for kb in 0..5 {
            let byte = (127 + 10 * mb + kb) as u8;
            assert_eq!(s.ue8m0_byte(mb, kb), Some(byte));
            assert_eq!(expected[s.grid().packed_byte_offset(mb, kb)], byte);
            assert_eq!(s.get(mb, kb), Some(2f32.powi((10 * mb + kb) as i32)));
        }
    }
    assert_eq!(s.get(3, 0), None);
    assert_eq!(s.get(0, 5), None);
    assert_eq!(s.ue8m0_byte(0, 5), None);
    assert!(s.f32_storage().is_none());
}

#[test]
fn layout_b_strides_and_padding_and_layout_a() {
    let grid = ScaleGrid::new(3, 2).unwrap();
    let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // S = [[1, 2], [3, 4], [5, 6]]
    let b = HostScales::from_grid(ScaleLayout::ColMajorF32, grid, &values).unwrap();
    assert_eq!(b.shape(), [3, 2]);
    assert_eq!(b.strides(), [1, 4]);
    assert_eq!(
        b.f32_storage().unwrap(),
        &[1.0, 3.0, 5.0, 0.0, 2.0, 4.0, 6.0, 0.0]
    );
    assert_eq!(&b.storage_bytes()[12..16], &[0, 0, 0, 0], "padding is +0.0");
    assert_eq!(b.to_grid(), values);
    let a = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &values).unwrap();
    assert_eq!(a.strides(), [2, 1]);
    assert_eq!(a.f32_storage().unwrap(), &values);
    assert!(a.packed_storage().is_none());
    assert_eq!(a.ue8m0_byte(0, 0), None);
    // The views carry the same shapes and strides and read back the same values.
    for s in [&a, &b] {
        let v = s.view();
        assert_eq!(v.layout().strides(), s.strides());
        assert_eq!(v.detect("sf").unwrap(), s.layout());
        assert_eq!(v.get(2, 1), Some(6.0));
        assert_eq!(v.get(3, 0), None);
        assert_eq!(v.get(0, 2), None);
    }
}

#[test]
fn ue8m0_decoding_is_bit_shift() {
    // One int32 column of 4 rows: bytes 0, 1, 254, 255 of S[0, 0..4].
    let grid = ScaleGrid::new(1, 4).unwrap();
    let word = Ue8m0x4(i32::from_le_bytes([0, 1, 254, 255]));
    let s = HostScales::from_packed_storage(grid, vec![word, word, word, word]).unwrap();
    assert_eq!(
        s.get(0, 0).unwrap().to_bits(),
        0,
        "byte 0 is +0.0, not 2^-127"
    );
    assert_eq!(s.get(0, 1), Some(f32::MIN_POSITIVE)); // 2^-126
    assert_eq!(s.get(0, 2), Some(2f32.powi(127)));
    assert_eq!(s.get(0, 3), Some(f32::INFINITY));
    // Rows 1..3 were padding and are cleared.
    assert_eq!(s.packed_storage().unwrap()[1..], [Ue8m0x4(0); 3]);
    // The view decodes the same way, padding bytes included.
    let v = s.view();
    assert_eq!(v.detect("sf").unwrap(), ScaleLayout::PackedUe8m0);
    assert_eq!(v.get(0, 3), Some(f32::INFINITY));
    assert_eq!(v.get(0, 4), None);
}

#[test]
fn from_storage_clears_padding() {
    // Layout B, nbm = 3 (aligned 4), nbk = 2: the allocation is poisoned with 7.0.
    let grid = ScaleGrid::new(3, 2).unwrap();
    let b = HostScales::from_f32_storage(ScaleLayout::ColMajorF32, grid, vec![7.0; 8]).unwrap();
    assert_eq!(
        b.f32_storage().unwrap(),
        &[7.0, 7.0, 7.0, 0.0, 7.0, 7.0, 7.0, 0.0]
    );
    let a = HostScales::from_f32_storage(ScaleLayout::RowMajorF32, grid, vec![7.0; 6]).unwrap();
    assert_eq!(a.f32_storage().unwrap(), &[7.0; 6]);
    // Layout C, nbm = 3, nbk = 5: poisoned with 0xFF bytes.
    let grid = ScaleGrid::new(3, 5).unwrap();
    let c = HostScales::from_packed_storage(grid, vec![Ue8m0x4(-1); 8]).unwrap();
    #[rustfmt::skip]
    let expected: [u8; 32] = [
        255, 255, 255, 255,  255, 255, 255, 255,  255, 255, 255, 255,  0, 0, 0, 0,
        255, 0, 0, 0,        255, 0, 0, 0,        255, 0, 0, 0,        0, 0, 0, 0,
    ];
    assert_eq!(c.storage_bytes(), expected);
    // Rejections.
    let e = HostScales::from_f32_storage(ScaleLayout::ColMajorF32, grid, vec![0.0; 5]).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "storage", .. }), "{e:?}");
    let e = HostScales::from_packed_storage(grid, vec![Ue8m0x4(0); 7]).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "storage", .. }), "{e:?}");
    let e = HostScales::from_f32_storage(ScaleLayout::PackedUe8m0, grid, vec![0.0; 8]).unwrap_err();
    assert_param(e, "layout", &["from_packed_storage"]);
}

#[test]
fn from_grid_rejects_values_packed_scales_cannot_hold() {
    let grid = ScaleGrid::new(1, 2).unwrap();
    let packed = ScaleLayout::PackedUe8m0;
    for bad in [3.0, -1.0, -0.0, f32::NAN, 1e-40, f32::NEG_INFINITY] {
        let e = HostScales::from_grid(packed, grid, &[1.0, bad]).unwrap_err();
        assert_param(e, "values", &["S[0, 1]", "UE8M0"]);
    }
    for ok in [0.0, f32::MIN_POSITIVE, 0.5, 2f32.powi(127), f32::INFINITY] {
        let s = HostScales::from_grid(packed, grid, &[1.0, ok]).unwrap();
        assert_eq!(s.get(0, 1).unwrap().to_bits(), ok.to_bits());
    }
    // fp32 layouts hold anything.
    let s = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &[3.0, -0.0]).unwrap();
    assert_eq!(s.get(0, 1).unwrap().to_bits(), (-0.0f32).to_bits());
    let e = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &[1.0]).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "values", .. }), "{e:?}");
}

#[test]
fn to_layout_round_trips() {
    let c = pow2_grid(ScaleLayout::PackedUe8m0, 5, 6);
    let a = c.to_layout(ScaleLayout::RowMajorF32).unwrap();
    let b = a.to_layout(ScaleLayout::ColMajorF32).unwrap();
    assert_eq!(a.to_grid(), c.to_grid());
    assert_eq!(b.to_grid(), c.to_grid());
    assert_eq!(b.to_layout(ScaleLayout::PackedUe8m0).unwrap(), c);
    assert_eq!(b.f32_storage().unwrap().len(), 6 * 8);
    let odd = HostScales::from_grid(
        ScaleLayout::RowMajorF32,
        ScaleGrid::new(1, 1).unwrap(),
        &[3.0],
    )
    .unwrap();
    assert_param(
        odd.to_layout(ScaleLayout::PackedUe8m0).unwrap_err(),
        "values",
        &["UE8M0"],
    );
}

fn layout(shape: &[usize], strides: &[usize]) -> Layout {
    Layout::new(shape.to_vec(), strides.to_vec(), 0).unwrap()
}

#[test]
fn reader_rules_detect_layouts() {
    use ScaleLayout::*;
    let detect = |dt, shape: &[usize], strides: &[usize]| {
        detect_scale_layout("x.sf", dt, &layout(shape, strides))
    };
    assert_eq!(detect(DType::F32, &[3, 5], &[5, 1]).unwrap(), RowMajorF32);
    assert_eq!(detect(DType::F32, &[3, 5], &[7, 1]).unwrap(), RowMajorF32); // padded rows
    assert_eq!(detect(DType::F32, &[3, 5], &[1, 4]).unwrap(), ColMajorF32);
    assert_eq!(
        detect(DType::UE8M0x4, &[3, 2], &[1, 4]).unwrap(),
        PackedUe8m0
    );
    assert_eq!(detect(DType::I32, &[3, 2], &[1, 4]).unwrap(), PackedUe8m0);
    // (n, 1) with stride(0) == 1 always reads as column-major.
    assert_eq!(detect(DType::F32, &[3, 1], &[1, 1]).unwrap(), ColMajorF32);
    // Empty tensors skip the stride(1) check.
    assert_eq!(detect(DType::F32, &[0, 5], &[5, 7]).unwrap(), RowMajorF32);
    // Row-major packed scales are rejected.
    let e = detect(DType::UE8M0x4, &[3, 2], &[2, 1]).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Dtype {
                arg: "x.sf",
                got: DType::UE8M0x4,
                ..
            }
        ),
        "{e:?}"
    );
    // Neither unit stride.
    let e = detect(DType::F32, &[3, 5], &[10, 2]).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "x.sf", .. }), "{e:?}");
    // Other dtypes, in both branches.
    for strides in [[1, 4], [5, 1]] {
        let e = detect(DType::BF16, &[3, 5], &strides).unwrap_err();
        assert!(
            matches!(
                e,
                TkError::Dtype {
                    arg: "x.sf",
                    got: DType::BF16,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    // Rank.
    let e = detect(DType::F32, &[2, 3, 5], &[15, 5, 1]).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x.sf", .. }), "{e:?}");
}

#[test]
fn scale_view_check_and_get() {
    // Every layout's own view is detected as that layout and matches its grid.
    for (nbm, nbk) in [(1, 1), (1, 5), (3, 1), (5, 6), (0, 3)] {
        for layout in [
            ScaleLayout::RowMajorF32,
            ScaleLayout::ColMajorF32,
            ScaleLayout::PackedUe8m0,
        ] {
            let s = pow2_grid(layout, nbm, nbk);
            let v = s.view();
            let detected = v.check("x.sf", &s.grid()).unwrap();
            // A (n, 1) or (1, 1) row-major tensor has stride(0) == 1 and reads as B: same values.
            if layout == ScaleLayout::RowMajorF32 && nbk == 1 && nbm > 0 {
                assert_eq!(detected, ScaleLayout::ColMajorF32);
            } else {
                assert_eq!(detected, layout, "({nbm}, {nbk}) {layout:?}");
            }
            for mb in 0..nbm {
                for kb in 0..nbk {
                    assert_eq!(v.get(mb, kb), s.get(mb, kb));
                }
            }
            // A grid of another shape is rejected, naming the argument.
            let other = ScaleGrid::new(nbm + 1, nbk).unwrap();
            assert_eq!(err_arg(&v.check("x.sf", &other).unwrap_err()), "x.sf");
        }
    }
    // Packed view: padding bytes read as +0.0.
    let s = pow2_grid(ScaleLayout::PackedUe8m0, 2, 5);
    assert_eq!(s.view().get(1, 7).unwrap().to_bits(), 0);
    // A strided fp32 view built by hand (layout B with a larger column pitch).
    let data: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let v = HostView::new(&data, layout(&[3, 4], &[1, 5])).unwrap();
    let sv = ScaleView::F32(v);
    assert_eq!(
        sv.check("x.sf", &ScaleGrid::new(3, 4).unwrap()).unwrap(),
        ScaleLayout::ColMajorF32
    );
    assert_eq!(sv.get(2, 3), Some(17.0));
    assert_eq!(sv.dtype(), DType::F32);
}
