//! Where an admission prefills: a window of lanes `first..first + b` of the lane-major
//! states, `b` one of the engine's batch buckets. A bucket-`b` prefill plan with its state
//! slots moved `first` lanes in writes those lanes only (its other rows are padding at
//! position −1, which write nothing), so a lane joins at the cost of the smallest bucket
//! that holds it instead of the session's.

use specc_ir::engine::{Engine, GraphRole, Slot, StepContract};

use crate::RuntimeError;

/// States of at most this many bytes a lane (per-lane knobs, RNG streams) do not constrain
/// where a window starts: a plan loaded at a lane where one's base would not be 16-byte
/// aligned reads and writes an aligned copy of the window's lanes, moved in before the
/// replay and back after it. Larger states (caches) set the windows' alignment instead.
pub const SHADOWED_LANE_BYTES: u64 = 256;

/// The windows a session's admissions may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionWindows {
    /// Batch buckets a prefill may run at, ascending; the last is the session's own.
    pub buckets: Vec<usize>,
    /// A window's first lane is a multiple of this (state slots moved by whole lanes stay
    /// 16-byte aligned).
    pub align: usize,
    /// Lanes the states hold (the engine's largest batch bucket): no window passes it.
    pub capacity: usize,
}

impl AdmissionWindows {
    /// The windows of a session of `contract` at batch bucket `lanes` over `engine`'s
    /// states (lane-major ones: `lane_major`, else the session's own bucket only): every
    /// batch bucket below `lanes` at which the method's prefill roles are planned at the
    /// same prompt buckets as at `lanes`, first lanes aligned so that each state slot a
    /// prefill names stays 16-byte aligned when moved by whole lanes (but those of at most
    /// [`SHADOWED_LANE_BYTES`] a lane).
    pub fn of_engine(
        engine: &Engine,
        contract: &StepContract,
        lanes: usize,
        lane_major: bool,
    ) -> Self {
        if !lane_major {
            return Self::whole(lanes);
        }
        let buckets = engine.batch_buckets();
        let capacity = buckets.iter().copied().max().unwrap_or(1) as u64;
        let roles: Vec<GraphRole> = std::iter::once(contract.target_prefill)
            .chain(contract.draft_prefill)
            .collect();
        let state_bytes = |name: &str| {
            engine
                .states
                .iter()
                .filter(|s| s.name == name)
                .map(|s| s.bytes)
                .max()
                .unwrap_or(0)
        };
        let mut align = 1u64;
        for p in engine.plans.iter().filter(|p| roles.contains(&p.role)) {
            for s in &p.slots {
                if let Slot::State(n) = s {
                    let per = state_bytes(n) / capacity.max(1);
                    if per > SHADOWED_LANE_BYTES {
                        let a = 16 / gcd(per, 16);
                        align = align * a / gcd(align, a);
                    }
                }
            }
        }
        let same_chunks = |b: u32| {
            roles
                .iter()
                .all(|&r| engine.token_buckets(r, b) == engine.token_buckets(r, lanes as u32))
        };
        let smaller: Vec<usize> = buckets
            .into_iter()
            .filter(|&b| (b as usize) < lanes && same_chunks(b))
            .map(|b| b as usize)
            .collect();
        Self::new(smaller, lanes, align as usize, capacity as usize)
    }

    /// Windows over `buckets` (any order; `lanes`, the session's bucket, is added) with
    /// first lanes aligned to `align` (≥ 1), inside `capacity` lanes.
    pub fn new(mut buckets: Vec<usize>, lanes: usize, align: usize, capacity: usize) -> Self {
        buckets.retain(|&b| b > 0 && b < lanes);
        buckets.push(lanes);
        buckets.sort_unstable();
        buckets.dedup();
        AdmissionWindows {
            buckets,
            align: align.max(1),
            capacity: capacity.max(lanes),
        }
    }

    /// Only the session's own bucket from lane 0 (states that are not all lane-major).
    pub fn whole(lanes: usize) -> Self {
        AdmissionWindows {
            buckets: vec![lanes],
            align: 1,
            capacity: lanes,
        }
    }

    fn own(&self) -> (usize, usize) {
        (*self.buckets.last().expect("the session's bucket"), 0)
    }

    /// `(b, first)` of the smallest window holding every lane of `at`, else the session's
    /// own bucket from lane 0.
    pub fn covering(&self, at: &[usize]) -> (usize, usize) {
        let (Some(&lo), Some(&hi)) = (at.iter().min(), at.iter().max()) else {
            return self.own();
        };
        let a = self.align;
        for &b in &self.buckets {
            for first in [lo / a * a, self.capacity.saturating_sub(b).min(lo) / a * a] {
                if first + b > hi && first + b <= self.capacity {
                    return (b, first);
                }
            }
        }
        self.own()
    }

    /// `(b, first)` of lane `lane` admitted alone with tokens that must not depend on the
    /// lane or the load: the smallest bucket whose aligned windows tile the states, the
    /// same for every lane (one plan, one rounding), else the session's own from lane 0.
    pub fn lone(&self, lane: usize) -> (usize, usize) {
        let fits = |b: usize| b.is_multiple_of(self.align) && self.capacity.is_multiple_of(b);
        match self.buckets.iter().find(|&&b| fits(b)) {
            Some(&b) => (b, lane / b * b),
            None => self.own(),
        }
    }
}

/// Whether every state of the method's graphs leads with the lane axis, so the first `b`
/// lanes of each state buffer are what a bucket-`b` graph reads.
pub fn lane_major(engine: &Engine, contract: &StepContract) -> Result<bool, RuntimeError> {
    for g in engine
        .graphs
        .iter()
        .filter(|g| contract.roles().contains(&g.role))
    {
        let parsed = specc_ir::text::parse(&g.ir)
            .map_err(|e| RuntimeError::Engine(format!("graph `{}`: {e}", g.role)))?;
        if !parsed
            .states()
            .all(|(_, _, ty)| ty.shape.dims().first() == Some(&specc_ir::op::B))
        {
            return Ok(false);
        }
    }
    Ok(true)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_lane_prefills_at_the_smallest_bucket_in_its_own_window() {
        let w = AdmissionWindows::new(vec![1, 2, 4, 8, 16], 16, 1, 16);
        assert_eq!(w.lone(0), (1, 0));
        assert_eq!(w.lone(13), (1, 13));
        // Alignment 4 (an i32-per-lane state): every lane takes a 4-lane window.
        let w = AdmissionWindows::new(vec![1, 2, 4, 8, 16], 16, 4, 16);
        assert_eq!(w.lone(0), (4, 0));
        assert_eq!(w.lone(6), (4, 4));
        assert_eq!(w.lone(15), (4, 12));
    }

    #[test]
    fn lanes_admitted_together_share_the_smallest_window_that_holds_them() {
        let w = AdmissionWindows::new(vec![1, 2, 4, 8, 16], 16, 1, 16);
        assert_eq!(w.covering(&[5]), (1, 5));
        assert_eq!(w.covering(&[5, 6]), (2, 5));
        assert_eq!(w.covering(&[3, 5, 6]), (4, 3));
        assert_eq!(w.covering(&[1, 9]), (16, 0));
        // Near the end of the states the window slides back to fit.
        assert_eq!(w.covering(&[14, 15]), (2, 14));
        let w = AdmissionWindows::new(vec![1, 2, 4, 8, 16], 16, 4, 16);
        assert_eq!(w.covering(&[5, 6]), (4, 4));
        assert_eq!(w.covering(&[3, 4]), (8, 0));
        assert_eq!(w.covering(&[13, 14]), (4, 12));
    }

    #[test]
    fn without_smaller_buckets_every_admission_uses_the_session_bucket() {
        let w = AdmissionWindows::new(vec![8], 8, 1, 8);
        assert_eq!(w.lone(5), (8, 0));
        assert_eq!(w.covering(&[2, 3]), (8, 0));
        assert_eq!(AdmissionWindows::whole(4).lone(3), (4, 0));
        // A session below the states' capacity: windows still stay inside the states.
        let w = AdmissionWindows::new(vec![1, 2, 4, 16], 4, 1, 16);
        assert_eq!(w.buckets, vec![1, 2, 4]);
        assert_eq!(w.covering(&[0, 3]), (4, 0));
        // Alignment 3 divides no bucket: a lone lane falls back to the whole session.
        let w = AdmissionWindows::new(vec![1, 2, 4, 8], 8, 3, 8);
        assert_eq!(w.lone(5), (8, 0));
        assert_eq!(w.covering(&[4]), (2, 3));
    }
}
