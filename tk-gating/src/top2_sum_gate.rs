//! `top2_sum_gate` (`spec/moe.md` §4.5): the full MoE router — scoring, bias, group-limited
//! routing on top-2 group sums, stable top-`K`, weight normalisation with routed scaling,
//! shared experts as routed slots, the logical → physical expert map and EP/TP masking.
//!
//! # Arguments
//!
//! | argument | shape | dtype | layout / meaning |
//! |---|---|---|---|
//! | `logits` | `(T, E)`, `T >= 0`, `E >= 1` | fp32 | unit column stride, any row stride. Router logits of the `E` routed experts |
//! | `bias` | `(E,)` | fp32 | any stride. Added to the ranking key only, never to the weights |
//! | `mask` (optional) | `(T,)` | bool as `u8` | any stride. `0` = padding token (not routed), any other value = route |
//! | `fix_routing_mask` (optional) | `(T,)` | bool as `u8` | any stride. Non-zero = take the experts from `unmapped_topk_idx` instead of selecting. Needs `unmapped_topk_idx` |
//! | `to_physical_map` (optional, with `logical_count`) | `(E + S, D)`, `D >= 1` | i32 | any strides. Up to `D` physical replicas per logical expert; `X = D - 1` extra experts |
//! | `logical_count` (with `to_physical_map`) | `(E + S,)` | i32 | any stride. Valid replicas per logical expert, `1 <= count <= D` |
//! | `unmapped_topk_idx` (optional, in/out) | `(T, K)` | i64 | unit column stride, any row stride. Read for fix-routing tokens; receives the logical routed ids |
//! | output `topk_idx` | `(T, K + S)` | i64 | contiguous |
//! | output `topk_weights` | `(T, K + S)` | fp32 | contiguous |
//!
//! Scalars ([`Top2SumGateParams`]): `K = num_topk`, `G = num_groups`, `Gk = num_topk_groups`,
//! `S = num_shared_experts` (shared-as-routed slots; 0 = off), `routed_scaling_factor`,
//! `ep_rank`/`num_ep_ranks`, `tp_rank`/`num_tp_ranks`, `scoring_func`. Derived:
//! `P = K + S` (output width), `X = D - 1` (or 0 without a map), `R = (E + X) / num_ep_ranks`
//! (experts per EP rank).
//!
//! # Semantics, per token `t` (row of `logits`, padded rows included)
//!
//! 1. **Masked** (`mask[t] == 0`): `topk_idx[t, :] = -1`, `topk_weights[t, :] = 0.0`,
//!    `unmapped_topk_idx[t, :] = -1`. The row's logits are not used (they may be non-finite).
//! 2. **Scores** `s_j = f(logits[t, j])` ([`crate::scoring`]: sigmoid, sqrt-softplus, or softmax
//!    over the whole row).
//! 3. **Ranking key** `r_j = s_j + bias_j` for sigmoid / sqrt-softplus; `r_j = logits[t, j] +
//!    bias_j` (the raw logit, not the probability) for softmax.
//! 4. **Selection** `sel[0..K]` (logical routed ids):
//!    * fix routing (`fix_routing_mask[t] != 0`): `sel = unmapped_topk_idx[t, :]` as given
//!      (duplicates allowed), no grouping;
//!    * otherwise, when grouping is active (`G != Gk`): group `q` scores `top1 + top2` of its
//!      `E/G` keys (a duplicated maximum counts twice), the `Gk` best groups are kept, and only
//!      their experts are candidates; then `sel` = the `K` best candidates by `r`, best first.
//! 5. **Routed weights**, `k < K`: `den = ((1e-20 + s[sel[0]]) + s[sel[1]]) + ...` (fp32, slot
//!    order, starting from fp32(1e-20)), `w_k = (s[sel[k]] / den) * routed_scaling_factor`
//!    (division, then multiplication). The un-biased scores are used; duplicates count twice.
//! 6. **Shared slots**, `k in K..P`: logical id `E + (k - K)`, weight exactly `1.0` (not scaled).
//! 7. **Physical map** (when given), every slot: `c = (ep_rank + t·23333) mod
//!    logical_count[id]` in **64-bit** arithmetic ([`replica_column`]), `id = to_physical_map[id,
//!    c]`.
//! 8. **EP/TP masking** ([`mask_ep_tp`]): `id` becomes `-1` unless its owner EP rank `id / R`
//!    has TP index `tp_rank`, else its local id. Masked slots keep their weight.
//! 9. `unmapped_topk_idx[t, :] = sel` (for fix-routing tokens, the same values).
//!
//! **Tie rule:** higher key first, then the smaller index — for groups (smaller group index)
//! and experts (smaller expert id) alike; slots are written in selection order. All-equal keys
//! therefore select experts `0, 1, 2, ...` (upstream's stability test).
//!
//! **NaN / ±inf:** the logits of every routed (unmasked) token and the bias must be finite —
//! upstream's kernel traps on non-finite logits; here it is a typed error naming `logits` (or
//! `bias`), returned before any output is produced. With finite inputs, a ranking key can only
//! be non-finite through fp32 overflow of `logit + bias` (softmax, values near `f32::MAX`): such
//! keys follow [`crate::ranking`] (±inf by value; a group top-2 sum `+inf + -inf` is NaN and
//! ranks first).
//!
//! **Data rules** (checked by the CPU reference before any output is written, each a
//! [`TkError::Param`] naming the tensor): logits of routed tokens finite; bias finite;
//! `1 <= logical_count[l] <= D`; `to_physical_map[l, c]` in `[0, E + X)` for `c <
//! logical_count[l]`; fix-routing ids in `[0, E)`. (The GPU kernel's report of these is pending.)
//!
//! # Limits and deviations from upstream
//!
//! * **Lifted** (upstream's kernel limits): `E % 4 == 0`, `K <= 32`, `G <= 32`, `E/G <= 32`,
//!   `K + S <= 32`; the contiguity of `logits` (any row stride), `mask`, `fix_routing_mask`,
//!   `to_physical_map`, `logical_count` (any strides).
//! * **Fixed**: the replica choice is 64-bit (upstream's int32 `t·23333` overflows from
//!   `t = 92 037` and indexes the map with a negative column); fix-routing ids and map entries are
//!   range-checked instead of read out of bounds; `logical_count == 0` is an error instead of a
//!   division by zero.
//! * **Kept** (semantic rules of upstream's wrapper, each a [`TkError::Param`]):
//!   `1 <= K <= E`; `G` and `Gk` both 0 or both non-zero, `Gk <= G`, `E % G == 0`; when grouping
//!   is active `E/G >= 2` (a top-2 needs two experts) and `K <= Gk·E/G` (enough candidates);
//!   `S ∈ {0, 1, 2}` with, for `S > 0`, `K % S == 0`, `E % (K/S) == 0` and `S <= X` (so
//!   shared-as-routed needs a `to_physical_map` of at least `S + 1` columns);
//!   `routed_scaling_factor` finite; `scoring_func != identity`.
//! * **Added** (rank sanity, upstream divides by zero or silently drops everything instead):
//!   `num_ep_ranks >= 1`, `ep_rank < num_ep_ranks`, `R >= 1`, `num_tp_ranks >= 1`,
//!   `tp_rank < num_tp_ranks`. `(E + X) % num_ep_ranks` and `num_ep_ranks % num_tp_ranks` are not
//!   required (as upstream): the formulas apply as written.
//! * `T == 0` gives empty `(0, P)` outputs (and an empty `(0, K)` `unmapped_topk_idx`).
//! * **GPU op only** ([`MAX_GPU_EXPERTS`]): `E <= 1024` (the row sits in registers; a larger
//!   `E` is a [`TkError::Param`] naming `logits`), `T < 2^32`, `E + X < 2^31` (naming
//!   `to_physical_map`) and `num_tp_ranks < 2^31` (naming `tp_rank`): the kernel's EP/TP
//!   masking runs in 32-bit arithmetic.
//!
//! # GPU kernel (feature `cuda`)
//!
//! `cuda/top2_sum_gate.cu`, specialised on `(E, K, G, Gk, scoring_func)`; the mask, fix
//! routing, physical map, `S` and the ranks are run-time arguments. One warp per token, the grid
//! at most one resident wave, each warp prefetching its next token's row: the row
//! in registers (runs of 8 experts per lane when `E` is a multiple of 256 and a grouping fits
//! them, else of 4), scores (sigmoid straight-line: double `exp` without its overflow branch on
//! clamped arguments, the fast path of IEEE division), keys, group top-2 sums (in registers
//! when `E / G` is a power of two from the run length to 32 runs and `G <= 32`: each lane's
//! runs' top-2 keys merged over the group's lanes with shuffles, then every group ranked
//! against all others at once; otherwise through shared memory, lane `l` scoring groups
//! `l, l + 32, ...`, and `Gk` selection rounds), `K` warp selection rounds on keys (distinct
//! picks, no overwriting; each lane caches its two best candidates, so a round is two
//! `redux.sync` and a rescan only when the winner's cache runs dry; the pick's score is read
//! back from the warp's copy of the scores in shared memory), the weight denominator
//! accumulated in slot order from the picks, one lane per output slot. No host sync.
//!
//! **Numerics.** Every fp32 step is the reference's own IEEE operation (`_rn` intrinsics, so no
//! FMA contraction; softmax's `Z` in [`warp_sum`](crate::scoring::warp_sum)'s order). CUDA's
//! `expf` (2 ulp) and `log1pf` (1 ulp) are *not* used: the kernel evaluates `exp` and `log1p` in
//! double precision and rounds once to fp32, the construction of `tk_core::math` that the CPU
//! reference uses. Both double results lie within about one double ulp of the exact value, so
//! the fp32 scores agree bit for bit unless the exact value lies within ~2⁻²⁸ fp32 ulp of a
//! rounding midpoint — then a score, and hence a weight, can differ in the last bit, well inside
//! the spec's tolerance (`rtol = 1e-5`, see `testing` with feature `cpu`); indices can only
//! differ where two ranking keys are that close, which the spec's test inputs exclude.
//!
//! **Data rules on the GPU.** Checking them would need a host sync, so the GPU op checks shapes
//! and parameters only; the kernel stays memory-safe on bad data: a fix-routing id outside
//! `0..E` gives score 0, `topk_idx = -1` (and is written back to `unmapped_topk_idx` as given);
//! a `logical_count` outside `1..=D` or a map entry outside `0..E + X` gives `topk_idx = -1`;
//! non-finite logits or bias give unspecified (but in-range) indices and weights.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_rank, check_unit_last_stride, check_vector};
use crate::scoring::ScoringFunc;

/// The spec's `top2_sum_gate` configurations (§4.5, §6): `(groups, topk_groups, E, S, K)` with
/// `S` the shared experts; each runs with the three scoring functions.
pub const SPEC_CONFIGS: [(usize, usize, usize, usize, usize); 11] = [
    (0, 0, 72, 1, 6),
    (0, 0, 32, 2, 6),
    (0, 0, 64, 2, 6),
    (0, 0, 96, 2, 6),
    (0, 0, 16, 2, 6),
    (0, 0, 36, 2, 6),
    (0, 0, 108, 2, 6),
    (0, 0, 128, 2, 6),
    (0, 0, 144, 2, 6),
    (8, 8, 256, 2, 8),
    (8, 4, 256, 2, 8),
];

/// The multiplier of the token index in the replica choice (upstream's `large_prime_number`).
pub const REPLICA_PRIME: u64 = 23_333;

/// The first token index whose replica product `t · 23333` overflows upstream's int32 (§5.9):
/// `92 036 · 23 333 = 2 147 475 988` is the last product that fits.
pub const UPSTREAM_REPLICA_OVERFLOW_TOKEN: usize = 92_037;

/// The value every weight normalisation starts from (fp32(1e-20)).
pub const WEIGHT_DENOMINATOR_EPS: f32 = 1e-20;

/// The scalar parameters of `top2_sum_gate` (see the module docs for their rules).
///
/// [`Top2SumGateParams::new`] gives plain top-`K` routing (no groups, no shared slots, scaling
/// 1, one EP and one TP rank); the `with_*` methods set the rest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Top2SumGateParams {
    /// `K`: routed experts per token, `1 <= K <= E`.
    pub num_topk: usize,
    /// `G`: expert groups (0 = no groups).
    pub num_groups: usize,
    /// `Gk`: groups kept per token (0 = no groups). Grouping is active when `G != Gk`.
    pub num_topk_groups: usize,
    /// `S`: shared experts appended as routed slots (upstream's `num_shared_experts` when
    /// `use_shared_as_routed`, else 0): 0, 1 or 2.
    pub num_shared_experts: usize,
    /// Multiplies the normalised routed weights (finite).
    pub routed_scaling_factor: f32,
    /// This EP rank (only affects the replica choice).
    pub ep_rank: usize,
    /// Number of EP ranks; sets `R = (E + X) / num_ep_ranks`.
    pub num_ep_ranks: usize,
    /// This TP rank.
    pub tp_rank: usize,
    /// Number of TP ranks.
    pub num_tp_ranks: usize,
    /// Sigmoid, sqrt-softplus or softmax (identity is rejected).
    pub scoring_func: ScoringFunc,
}

impl Top2SumGateParams {
    /// Plain top-`num_topk` routing with `scoring_func`: no groups, no shared slots,
    /// `routed_scaling_factor = 1`, EP rank 0 of 1, TP rank 0 of 1.
    pub const fn new(num_topk: usize, scoring_func: ScoringFunc) -> Self {
        Self {
            num_topk,
            num_groups: 0,
            num_topk_groups: 0,
            num_shared_experts: 0,
            routed_scaling_factor: 1.0,
            ep_rank: 0,
            num_ep_ranks: 1,
            tp_rank: 0,
            num_tp_ranks: 1,
            scoring_func,
        }
    }

    /// Upstream's positional scalar arguments, in upstream's order (`scoring_func` parsed
    /// case-insensitively). With `use_shared_as_routed == false`, `num_shared_experts` is
    /// ignored (forced to 0), as upstream does. Only the label is checked here; everything else
    /// is checked by [`Top2SumGateParams::validate`].
    #[allow(clippy::too_many_arguments)]
    pub fn upstream(
        num_topk: usize,
        num_topk_groups: usize,
        num_groups: usize,
        use_shared_as_routed: bool,
        num_shared_experts: usize,
        routed_scaling_factor: f32,
        ep_rank: usize,
        num_ep_ranks: usize,
        tp_rank: usize,
        num_tp_ranks: usize,
        scoring_func: &str,
    ) -> Result<Self> {
        Ok(Self {
            num_topk,
            num_groups,
            num_topk_groups,
            num_shared_experts: if use_shared_as_routed {
                num_shared_experts
            } else {
                0
            },
            routed_scaling_factor,
            ep_rank,
            num_ep_ranks,
            tp_rank,
            num_tp_ranks,
            scoring_func: ScoringFunc::from_label(scoring_func)?,
        })
    }

    /// Sets `G` and `Gk` (group-limited routing when they differ).
    pub const fn with_groups(mut self, num_groups: usize, num_topk_groups: usize) -> Self {
        self.num_groups = num_groups;
        self.num_topk_groups = num_topk_groups;
        self
    }

    /// Appends `num_shared_experts` shared experts as routed slots (needs a physical map).
    pub const fn with_shared_as_routed(mut self, num_shared_experts: usize) -> Self {
        self.num_shared_experts = num_shared_experts;
        self
    }

    /// Sets the routed scaling factor.
    pub const fn with_routed_scaling_factor(mut self, routed_scaling_factor: f32) -> Self {
        self.routed_scaling_factor = routed_scaling_factor;
        self
    }

    /// Sets this EP rank and the EP rank count.
    pub const fn with_ep(mut self, ep_rank: usize, num_ep_ranks: usize) -> Self {
        self.ep_rank = ep_rank;
        self.num_ep_ranks = num_ep_ranks;
        self
    }

    /// Sets this TP rank and the TP rank count.
    pub const fn with_tp(mut self, tp_rank: usize, num_tp_ranks: usize) -> Self {
        self.tp_rank = tp_rank;
        self.num_tp_ranks = num_tp_ranks;
        self
    }

    /// True when group-limited routing is on (`G != Gk`).
    pub const fn grouping_active(&self) -> bool {
        self.num_groups != self.num_topk_groups
    }

    /// Validates the parameters against the argument layouts and returns the geometry. Every
    /// rule of the module docs that does not depend on tensor *values* is checked here; errors
    /// name the argument ([`TkError::Shape`], [`TkError::Empty`], [`TkError::Stride`],
    /// [`TkError::Param`]).
    pub fn validate(&self, layouts: &Top2SumGateLayouts<'_>) -> Result<Top2SumGateShape> {
        if self.scoring_func == ScoringFunc::Identity {
            return Err(TkError::param(
                "scoring_func",
                "identity is not supported by top2_sum_gate (use sigmoid, sqrtsoftplus or \
                 softmax)",
            ));
        }

        // logits (T, E) and bias (E,).
        let logits = layouts.logits;
        check_rank("logits", logits, 2, "rank 2 (T, E)")?;
        let (t, e) = (logits.shape()[0], logits.shape()[1]);
        if e == 0 {
            return Err(TkError::Empty {
                arg: "logits",
                shape: logits.shape().to_vec(),
            });
        }
        check_unit_last_stride("logits", logits)?;
        check_vector("bias", layouts.bias, e, &format!("(E,) = ({e},)"))?;

        // K.
        let k = self.num_topk;
        if k == 0 || k > e {
            return Err(TkError::param(
                "num_topk",
                format!("must satisfy 1 <= num_topk <= E = {e}, got {k}"),
            ));
        }

        // Groups.
        let (g, gk) = (self.num_groups, self.num_topk_groups);
        if (g == 0) != (gk == 0) {
            return Err(TkError::param(
                "num_topk_groups",
                format!(
                    "num_groups ({g}) and num_topk_groups ({gk}) must be both 0 or both non-zero"
                ),
            ));
        }
        if gk > g {
            return Err(TkError::param(
                "num_topk_groups",
                format!("must be <= num_groups = {g}, got {gk}"),
            ));
        }
        if g != 0 && e % g != 0 {
            return Err(TkError::param(
                "num_groups",
                format!("E = {e} must be divisible by num_groups = {g}"),
            ));
        }
        let grouping = if g != gk {
            let size = e / g;
            if size < 2 {
                return Err(TkError::param(
                    "num_groups",
                    format!(
                        "group-limited routing ranks groups by a top-2 sum and needs E / num_groups \
                         >= 2 experts per group, got {e} / {g} = {size}"
                    ),
                ));
            }
            if k > gk * size {
                return Err(TkError::param(
                    "num_topk",
                    format!(
                        "must be <= num_topk_groups * E / num_groups = {gk} * {size} = {} (the \
                         candidates of the kept groups), got {k}",
                        gk * size
                    ),
                ));
            }
            Some(Grouping {
                num_groups: g,
                num_topk_groups: gk,
                group_size: size,
            })
        } else {
            None
        };

        // Shared experts as routed slots.
        let s = self.num_shared_experts;
        if s != 0 {
            if s > 2 {
                return Err(TkError::param(
                    "num_shared_experts",
                    format!("must be 0 (off), 1 or 2, got {s}"),
                ));
            }
            if k % s != 0 || e % (k / s) != 0 {
                return Err(TkError::param(
                    "num_shared_experts",
                    format!(
                        "shared-as-routed needs num_topk % S == 0 and E % (num_topk / S) == 0 \
                         (num_topk = {k}, E = {e}, S = {s})"
                    ),
                ));
            }
        }

        if !self.routed_scaling_factor.is_finite() {
            return Err(TkError::param(
                "routed_scaling_factor",
                format!("must be finite, got {}", self.routed_scaling_factor),
            ));
        }

        // Physical map.
        let logical = e + s;
        let replicas = match layouts.physical_map {
            None => None,
            Some((map, count)) => {
                check_rank("to_physical_map", map, 2, "rank 2 (E + S, D)")?;
                if map.shape()[0] != logical || map.shape()[1] == 0 {
                    return Err(TkError::Shape {
                        arg: "to_physical_map",
                        expected: format!("(E + S, D) = ({logical}, D) with D >= 1"),
                        got: map.shape().to_vec(),
                    });
                }
                check_vector(
                    "logical_count",
                    count,
                    logical,
                    &format!("(E + S,) = ({logical},)"),
                )?;
                Some(map.shape()[1])
            }
        };
        let extra = replicas.map_or(0, |d| d - 1);
        if s > extra {
            return Err(TkError::param(
                "num_shared_experts",
                format!(
                    "S = {s} shared-as-routed experts need at least S extra experts, i.e. a \
                     to_physical_map with at least {} columns; got {}",
                    s + 1,
                    match replicas {
                        Some(d) => format!("{d} columns (X = {extra})"),
                        None => "no to_physical_map (X = 0)".into(),
                    }
                ),
            ));
        }

        // EP / TP ranks.
        if self.num_ep_ranks == 0 || self.ep_rank >= self.num_ep_ranks {
            return Err(TkError::param(
                "ep_rank",
                format!(
                    "must satisfy ep_rank < num_ep_ranks with num_ep_ranks >= 1, got {} of {}",
                    self.ep_rank, self.num_ep_ranks
                ),
            ));
        }
        let experts_per_rank = (e + extra) / self.num_ep_ranks;
        if experts_per_rank == 0 {
            return Err(TkError::param(
                "num_ep_ranks",
                format!(
                    "E + X = {} experts cannot be spread over {} EP ranks (R = (E + X) / \
                     num_ep_ranks would be 0)",
                    e + extra,
                    self.num_ep_ranks
                ),
            ));
        }
        if self.num_tp_ranks == 0 || self.tp_rank >= self.num_tp_ranks {
            return Err(TkError::param(
                "tp_rank",
                format!(
                    "must satisfy tp_rank < num_tp_ranks with num_tp_ranks >= 1, got {} of {}",
                    self.tp_rank, self.num_tp_ranks
                ),
            ));
        }

        // Per-token tensors.
        if let Some(mask) = layouts.mask {
            check_vector("mask", mask, t, &format!("(T,) = ({t},)"))?;
        }
        if let Some(u) = layouts.unmapped_topk_idx {
            check_rank("unmapped_topk_idx", u, 2, "rank 2 (T, K)")?;
            if u.shape() != [t, k] {
                return Err(TkError::Shape {
                    arg: "unmapped_topk_idx",
                    expected: format!("(T, K) = ({t}, {k})"),
                    got: u.shape().to_vec(),
                });
            }
            check_unit_last_stride("unmapped_topk_idx", u)?;
        }
        if let Some(fix) = layouts.fix_routing_mask {
            check_vector("fix_routing_mask", fix, t, &format!("(T,) = ({t},)"))?;
            if layouts.unmapped_topk_idx.is_none() {
                return Err(TkError::param(
                    "fix_routing_mask",
                    "needs unmapped_topk_idx (the experts of the fix-routing tokens)",
                ));
            }
        }

        // 64-bit replica choice: ep_rank + (T - 1) * 23333 must not overflow u64.
        if replicas.is_some() && t > 0 {
            let ok = (t as u64 - 1)
                .checked_mul(REPLICA_PRIME)
                .and_then(|p| p.checked_add(self.ep_rank as u64))
                .is_some();
            if !ok {
                return Err(TkError::param(
                    "logits",
                    format!("{t} tokens overflow the 64-bit replica choice"),
                ));
            }
        }
        // Ids are i64 (and the map's entries i32): the id spaces must fit.
        if i64::try_from(e + extra + s).is_err() {
            return Err(TkError::param("logits", "E + X + S overflows i64"));
        }

        Ok(Top2SumGateShape {
            num_tokens: t,
            num_experts: e,
            num_topk: k,
            num_shared_experts: s,
            grouping,
            num_replicas: replicas,
            num_extra_experts: extra,
            experts_per_rank,
        })
    }
}

/// The layouts of `top2_sum_gate`'s tensor arguments, for [`Top2SumGateParams::validate`] (shared
/// by the CPU reference and the GPU launch).
#[derive(Debug, Clone, Copy)]
pub struct Top2SumGateLayouts<'a> {
    /// `logits (T, E)`.
    pub logits: &'a Layout,
    /// `bias (E,)`.
    pub bias: &'a Layout,
    /// `mask (T,)`.
    pub mask: Option<&'a Layout>,
    /// `fix_routing_mask (T,)`.
    pub fix_routing_mask: Option<&'a Layout>,
    /// `(to_physical_map (E + S, D), logical_count (E + S,))`: both or neither.
    pub physical_map: Option<(&'a Layout, &'a Layout)>,
    /// `unmapped_topk_idx (T, K)`.
    pub unmapped_topk_idx: Option<&'a Layout>,
}

/// Group-limited routing geometry (present when `G != Gk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouping {
    /// `G`.
    pub num_groups: usize,
    /// `Gk`.
    pub num_topk_groups: usize,
    /// `E / G`, at least 2.
    pub group_size: usize,
}

/// The validated geometry of one `top2_sum_gate` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Top2SumGateShape {
    /// `T`: tokens (rows, padded ones included), may be 0.
    pub num_tokens: usize,
    /// `E`: routed experts.
    pub num_experts: usize,
    /// `K`.
    pub num_topk: usize,
    /// `S`: shared-as-routed slots (0 when off).
    pub num_shared_experts: usize,
    /// Present when group-limited routing is active.
    pub grouping: Option<Grouping>,
    /// `D`, the map's column count, when a physical map is given.
    pub num_replicas: Option<usize>,
    /// `X = D - 1`, or 0 without a map.
    pub num_extra_experts: usize,
    /// `R = (E + X) / num_ep_ranks`, at least 1.
    pub experts_per_rank: usize,
}

impl Top2SumGateShape {
    /// `P = K + S`: the output width.
    pub const fn width(&self) -> usize {
        self.num_topk + self.num_shared_experts
    }

    /// The shape `(T, K + S)` of `topk_idx` and `topk_weights`.
    pub const fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.width()]
    }

    /// `E + S`: the logical expert count (rows of the physical map).
    pub const fn num_logical_experts(&self) -> usize {
        self.num_experts + self.num_shared_experts
    }

    /// `E + X`: the physical expert count (physical ids lie in `0..E + X`).
    pub const fn num_physical_experts(&self) -> usize {
        self.num_experts + self.num_extra_experts
    }
}

/// The replica column of token `token` (row index in the full logits, padded rows included):
/// `(ep_rank + token · 23333) mod logical_count`, in 64-bit arithmetic (§5.9; upstream uses
/// int32 and overflows from token 92 037). `None` when `logical_count == 0` or the 64-bit
/// arithmetic overflows (impossible for a validated call).
pub fn replica_column(ep_rank: usize, token: usize, logical_count: u64) -> Option<u64> {
    (token as u64)
        .checked_mul(REPLICA_PRIME)?
        .checked_add(ep_rank as u64)?
        .checked_rem(logical_count)
}

/// EP/TP masking of one expert id (§2): with `R = experts_per_rank`, the owner EP rank
/// `r = id / R` is kept iff `r mod num_tp_ranks == tp_rank`, and renumbered to the local id
/// `v - dp·(R·num_tp_ranks - R)` where `v = id - tp_rank·R` and `dp = v / (R·num_tp_ranks)`
/// (the implementations' formula; equal to `(r / num_tp_ranks)·R + id mod R`); every other id
/// becomes `-1`. Negative ids stay `-1`. Needs `experts_per_rank >= 1`, `num_tp_ranks >= 1`.
pub fn mask_ep_tp(id: i64, experts_per_rank: i64, tp_rank: i64, num_tp_ranks: i64) -> i64 {
    if id < 0 || experts_per_rank <= 0 || num_tp_ranks <= 0 {
        return -1;
    }
    let rank = id / experts_per_rank;
    if rank % num_tp_ranks != tp_rank {
        return -1;
    }
    let per_dp = experts_per_rank * num_tp_ranks;
    let v = id - tp_rank * experts_per_rank;
    let dp = v / per_dp;
    let local = v - dp * (per_dp - experts_per_rank);
    if local < 0 {
        -1
    } else {
        local
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_formula_matches_closed_form() {
        for r in 1..6i64 {
            for tp in 1..5i64 {
                for tp_rank in 0..tp {
                    for id in 0..(r * tp * 3) {
                        let owner = id / r;
                        let expected = if owner % tp == tp_rank {
                            (owner / tp) * r + id % r
                        } else {
                            -1
                        };
                        assert_eq!(mask_ep_tp(id, r, tp_rank, tp), expected);
                    }
                }
            }
        }
        assert_eq!(mask_ep_tp(-1, 2, 0, 1), -1);
    }

    #[test]
    fn replica_column_is_64_bit() {
        assert_eq!(replica_column(1, 0, 3), Some(1));
        assert_eq!(replica_column(1, 1, 3), Some(23_334 % 3));
        let t = UPSTREAM_REPLICA_OVERFLOW_TOKEN;
        assert!((t as i64 * 23_333) > i32::MAX as i64);
        assert!(((t - 1) as i64 * 23_333) <= i32::MAX as i64);
        assert_eq!(replica_column(0, t, 7), Some((t as u64 * 23_333) % 7));
        assert_eq!(replica_column(0, 1, 0), None);
    }
}

/// The most routed experts the GPU op takes (the row sits in registers, 32 experts per lane).
pub const MAX_GPU_EXPERTS: usize = 1024;

#[cfg(feature = "cuda")]
pub use gpu::{kernel_spec, top2_sum_gate, top2_sum_gate_into, Top2SumGateDeviceInputs};

/// The GPU op (feature `cuda`).
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{
        DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result, TkError,
    };

    use super::{Top2SumGateLayouts, Top2SumGateParams, Top2SumGateShape, MAX_GPU_EXPERTS};
    use crate::gpu::{check_device, check_out, check_tokens, resident_token_grid, HEADERS, WARPS};
    use crate::scoring::ScoringFunc;

    static SOURCE: KernelSource = KernelSource {
        file: "top2_sum_gate.cu",
        entry: "tk_top2_sum_gate",
        code: include_str!("../cuda/top2_sum_gate.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel specialisation for `E` experts, `K` routed slots, `G` groups of which `Gk`
    /// are kept (grouping is active when they differ; `G == Gk` specialises as no groups) and
    /// a scoring function (not identity).
    pub fn kernel_spec(
        num_experts: usize,
        num_topk: usize,
        num_groups: usize,
        num_topk_groups: usize,
        scoring_func: ScoringFunc,
    ) -> KernelSpec {
        let (g, gk) = if num_groups != num_topk_groups {
            (num_groups, num_topk_groups)
        } else {
            (0, 0)
        };
        KernelSpec::new(&SOURCE)
            .define("TK_E", num_experts)
            .define("TK_K", num_topk)
            .define("TK_G", g)
            .define("TK_GK", gk)
            .define("TK_SCORING", scoring_func.value())
            .define("TK_WARPS", WARPS)
    }

    /// The device tensors `top2_sum_gate` reads (shapes and rules in the module docs); the
    /// in/out `unmapped_topk_idx` is passed to the op separately. Booleans are bytes: `0` =
    /// false, anything else = true. All on one device.
    #[derive(Debug)]
    pub struct Top2SumGateDeviceInputs<'a> {
        /// `logits (T, E)` fp32, unit column stride.
        pub logits: DeviceView<'a, f32>,
        /// `bias (E,)` fp32.
        pub bias: DeviceView<'a, f32>,
        /// `mask (T,)` u8: `0` = padding token.
        pub mask: Option<DeviceView<'a, u8>>,
        /// `fix_routing_mask (T,)` u8: non-zero = use `unmapped_topk_idx[t, :]`.
        pub fix_routing_mask: Option<DeviceView<'a, u8>>,
        /// `(to_physical_map (E + S, D) i32, logical_count (E + S,) i32)`.
        pub physical_map: Option<(DeviceView<'a, i32>, DeviceView<'a, i32>)>,
    }

    impl<'a> Top2SumGateDeviceInputs<'a> {
        /// Just `logits` and `bias`.
        pub fn new(logits: DeviceView<'a, f32>, bias: DeviceView<'a, f32>) -> Self {
            Self {
                logits,
                bias,
                mask: None,
                fix_routing_mask: None,
                physical_map: None,
            }
        }

        /// Adds the token mask `(T,)` u8.
        pub fn with_mask(mut self, mask: DeviceView<'a, u8>) -> Self {
            self.mask = Some(mask);
            self
        }

        /// Adds the fix-routing mask `(T,)` u8 (needs `unmapped_topk_idx` at the call).
        pub fn with_fix_routing_mask(mut self, fix_routing_mask: DeviceView<'a, u8>) -> Self {
            self.fix_routing_mask = Some(fix_routing_mask);
            self
        }

        /// Adds the logical → physical map `(E + S, D)` i32 and `logical_count (E + S,)` i32.
        pub fn with_physical_map(
            mut self,
            to_physical_map: DeviceView<'a, i32>,
            logical_count: DeviceView<'a, i32>,
        ) -> Self {
            self.physical_map = Some((to_physical_map, logical_count));
            self
        }
    }

    /// Validates the inputs (layouts, parameters, the GPU limits, placement).
    fn validate(
        inputs: &Top2SumGateDeviceInputs<'_>,
        unmapped: Option<&DeviceViewMut<'_, i64>>,
        params: &Top2SumGateParams,
    ) -> Result<Top2SumGateShape> {
        let layouts = Top2SumGateLayouts {
            logits: inputs.logits.layout(),
            bias: inputs.bias.layout(),
            mask: inputs.mask.as_ref().map(|m| m.layout()),
            fix_routing_mask: inputs.fix_routing_mask.as_ref().map(|m| m.layout()),
            physical_map: inputs
                .physical_map
                .as_ref()
                .map(|(m, c)| (m.layout(), c.layout())),
            unmapped_topk_idx: unmapped.map(|u| u.layout()),
        };
        let shape = params.validate(&layouts)?;
        if shape.num_experts > MAX_GPU_EXPERTS {
            return Err(TkError::param(
                "logits",
                format!(
                    "the GPU op takes at most {MAX_GPU_EXPERTS} experts, got E = {}",
                    shape.num_experts
                ),
            ));
        }
        check_tokens("logits", shape.num_tokens)?;
        // The kernel's EP/TP masking runs in 32-bit: physical ids (< E + X, which bounds D) and
        // the TP rank count below 2^31.
        if shape.num_physical_experts() > i32::MAX as usize {
            return Err(TkError::param(
                "to_physical_map",
                format!(
                    "the GPU op takes fewer than 2^31 physical experts, got E + X = {}",
                    shape.num_physical_experts()
                ),
            ));
        }
        if params.num_tp_ranks > i32::MAX as usize {
            return Err(TkError::param(
                "tp_rank",
                format!(
                    "the GPU op takes fewer than 2^31 TP ranks, got {}",
                    params.num_tp_ranks
                ),
            ));
        }
        let dev = inputs.logits.device();
        check_device("bias", dev, inputs.bias.device())?;
        if let Some(m) = &inputs.mask {
            check_device("mask", dev, m.device())?;
        }
        if let Some(m) = &inputs.fix_routing_mask {
            check_device("fix_routing_mask", dev, m.device())?;
        }
        if let Some((m, c)) = &inputs.physical_map {
            check_device("to_physical_map", dev, m.device())?;
            check_device("logical_count", dev, c.device())?;
        }
        if let Some(u) = unmapped {
            check_device("unmapped_topk_idx", dev, u.device())?;
        }
        Ok(shape)
    }

    /// GPU `top2_sum_gate` → `(topk_idx (T, K + S) i64, topk_weights (T, K + S) fp32)`, both
    /// contiguous. `unmapped_topk_idx (T, K)` i64 (unit column stride) is upstream's in/out
    /// tensor: read for fix-routing tokens, overwritten with the logical routed ids (`-1` for
    /// masked tokens). See the module docs for the semantics, tie rule, NaN / inf behaviour,
    /// numerics and limits. Enqueued on `logits`' device stream; no host sync.
    ///
    /// Errors: those of [`Top2SumGateParams::validate`]; [`TkError::Param`] naming `logits` for
    /// `E > 1024` or `T >= 2^32`; [`TkError::Placement`] naming a tensor on another device.
    pub fn top2_sum_gate(
        inputs: &Top2SumGateDeviceInputs<'_>,
        unmapped_topk_idx: Option<&mut DeviceViewMut<'_, i64>>,
        params: &Top2SumGateParams,
    ) -> Result<(DeviceTensor<i64>, DeviceTensor<f32>)> {
        let shape = validate(inputs, unmapped_topk_idx.as_deref(), params)?;
        let dev = inputs.logits.device();
        let mut idx = dev.alloc::<i64>(&shape.out_shape())?;
        let mut w = dev.alloc::<f32>(&shape.out_shape())?;
        top2_sum_gate_into(
            inputs,
            unmapped_topk_idx,
            params,
            &mut idx.view_mut(),
            &mut w.view_mut(),
        )?;
        Ok((idx, w))
    }

    /// [`top2_sum_gate`] into caller-provided contiguous `topk_idx (T, K + S)` i64 and
    /// `topk_weights (T, K + S)` fp32 on the same device. Errors: as [`top2_sum_gate`], plus
    /// [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Placement`] naming `topk_idx` or
    /// `topk_weights`.
    pub fn top2_sum_gate_into(
        inputs: &Top2SumGateDeviceInputs<'_>,
        mut unmapped_topk_idx: Option<&mut DeviceViewMut<'_, i64>>,
        params: &Top2SumGateParams,
        topk_idx: &mut DeviceViewMut<'_, i64>,
        topk_weights: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let shape = validate(inputs, unmapped_topk_idx.as_deref(), params)?;
        let out_shape = shape.out_shape();
        check_out("topk_idx", topk_idx.layout(), &out_shape)?;
        check_out("topk_weights", topk_weights.layout(), &out_shape)?;
        let dev = inputs.logits.device();
        check_device("topk_idx", dev, topk_idx.device())?;
        check_device("topk_weights", dev, topk_weights.device())?;
        if shape.num_tokens == 0 {
            return Ok(());
        }
        let t = shape.num_tokens as u32;
        let ld = inputs.logits.layout().strides()[0] as u64;
        let x_addr = inputs.logits.address();
        let vec = (x_addr % 16 == 0 && (ld % 4 == 0 || t == 1)) as u32;
        let stride0 = |l: &tk_core::Layout| l.strides().first().copied().unwrap_or(0) as u64;
        let (bias_addr, bs) = (inputs.bias.address(), stride0(inputs.bias.layout()));
        let (mask_addr, ms) = inputs
            .mask
            .as_ref()
            .map_or((0, 0), |m| (m.address(), stride0(m.layout())));
        let (fix_addr, fs) = inputs
            .fix_routing_mask
            .as_ref()
            .map_or((0, 0), |m| (m.address(), stride0(m.layout())));
        let (map_addr, mp0, mp1, count_addr, cs) =
            inputs
                .physical_map
                .as_ref()
                .map_or((0, 0, 0, 0, 0), |(m, c)| {
                    let st = m.layout().strides();
                    (
                        m.address(),
                        st[0] as u64,
                        st[1] as u64,
                        c.address(),
                        stride0(c.layout()),
                    )
                });
        let (u_addr, ldu) = match unmapped_topk_idx.as_mut() {
            Some(u) => (u.address(), u.layout().strides()[0] as u64),
            None => (0, 0),
        };
        let s = shape.num_shared_experts as u32;
        let d = shape.num_replicas.unwrap_or(1) as u32;
        let rsf = params.routed_scaling_factor;
        let ep_rank = params.ep_rank as u64;
        // validate() proved these fit in 31 bits.
        let (r, tp_rank, tp) = (
            shape.experts_per_rank as u32,
            params.tp_rank as u32,
            params.num_tp_ranks as u32,
        );
        let (g, gk) = shape
            .grouping
            .map_or((0, 0), |g| (g.num_groups, g.num_topk_groups));
        let f = dev.function(&kernel_spec(
            shape.num_experts,
            shape.num_topk,
            g,
            gk,
            params.scoring_func,
        ))?;
        let (idx_addr, w_addr) = (topk_idx.address(), topk_weights.address());
        let cfg = resident_token_grid(dev, &f, shape.num_tokens)?;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&idx_addr)
            .arg(&w_addr)
            .arg(&u_addr)
            .arg(&ldu)
            .arg(&x_addr)
            .arg(&ld)
            .arg(&bias_addr)
            .arg(&bs)
            .arg(&mask_addr)
            .arg(&ms)
            .arg(&fix_addr)
            .arg(&fs)
            .arg(&map_addr)
            .arg(&mp0)
            .arg(&mp1)
            .arg(&count_addr)
            .arg(&cs)
            .arg(&t)
            .arg(&s)
            .arg(&d)
            .arg(&vec)
            .arg(&rsf)
            .arg(&ep_rank)
            .arg(&r)
            .arg(&tp_rank)
            .arg(&tp);
        // SAFETY: validate() proved every layout against the shape (views are bounds-checked at
        // creation): the kernel reads logits[t * ld + j] (j < E, 16-byte loads only when the
        // rows are 16-byte aligned), bias[j * bs], mask[t * ms], fix[t * fs] and
        // unmapped[t * ldu + k] (k < K) for t < T; map[l * mp0 + c * mp1] and count[l * cs] only
        // for l < E + S and c < count[l] <= D (checked in the kernel); fix-routing ids are read
        // from logits only when in 0..E. It writes the contiguous (T, K + S) outputs and
        // unmapped[t * ldu + k]. Null addresses are never dereferenced (the kernel tests them).
        // All buffers outlive the stream-ordered launch.
        unsafe { l.launch(cfg) }.ctx("launching tk_top2_sum_gate")?;
        Ok(())
    }
}
