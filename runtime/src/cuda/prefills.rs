//! A session's prefill graphs: each (role, prompt bucket) plan is loaded and captured as one
//! CUDA graph on its first use and replayed from then on, so a prefill costs one
//! `cuGraphLaunch` instead of one launch per kernel.
//!
//! A graph is captured per (role, batch bucket, prompt bucket, first lane): an admission
//! prefills the smallest bucket holding the lanes it admits, its state slots moved to them.
//!
//! Every prefill is captured: its launches are plain kernel launches over fixed arena
//! offsets, and its inputs and outputs move with copies outside the graph (inputs written
//! into the arena's input slots before the replay, from the host or from device memory such
//! as another prefill's output, [`Input`]; outputs read after it), so nothing in a prefill
//! depends on a host value at capture time.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use specc_ir::engine::{BucketPlan, GraphRole};

use super::buffer::check_range;
use super::{CudaEngine, CudaError, DeviceArena, DeviceBuffer, LoadedGraph, StepGraph};
use crate::admission::CopyRun;
use crate::RuntimeError;

/// Where the bytes of one prefill input come from.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Host bytes, exactly the input's size, uploaded.
    Host(&'a [u8]),
    /// Device-to-device copies: each run's `len` bytes at `src` of `from` to `dst` of the
    /// input (byte offsets); the input's bytes no run writes are zeroed.
    Device {
        from: &'a DeviceSpan,
        runs: &'a [CopyRun],
    },
}

/// `bytes` bytes of device memory at `offset` of `buf` (e.g. a prefill output in its
/// arena), named by `what` in errors.
#[derive(Clone, Debug)]
pub struct DeviceSpan {
    pub buf: Arc<DeviceBuffer>,
    pub offset: u64,
    pub bytes: u64,
    pub what: String,
}

impl DeviceSpan {
    /// Graph output (or input) `name` of `g`, in its arena.
    pub fn of_io(g: &LoadedGraph, name: &str, what: String) -> Result<DeviceSpan, RuntimeError> {
        let (offset, bytes) = g.io(name)?;
        Ok(DeviceSpan {
            buf: g.arena.buffer().clone(),
            offset,
            bytes,
            what,
        })
    }

    /// Enqueues the copy of `len` bytes at `src` of this span to `dst` of `to`, each range
    /// checked against its span first.
    pub fn copy_to(
        &self,
        to: &DeviceSpan,
        dst: u64,
        src: u64,
        len: u64,
    ) -> Result<(), RuntimeError> {
        self.check(src, len)?;
        to.check(dst, len)?;
        to.buf
            .copy_from(to.offset + dst, &self.buf, self.offset + src, len)
    }

    /// That `offset..offset + len` lies inside the span.
    fn check(&self, offset: u64, len: u64) -> Result<(), CudaError> {
        check_range(&self.what, offset, len, self.bytes)
    }

    /// Whether `a..a + len` of this span and `b..b + len` of `other` share a byte.
    fn overlaps(&self, a: u64, other: &DeviceSpan, b: u64, len: u64) -> bool {
        let (x, y) = (
            self.buf.ptr() + self.offset + a,
            other.buf.ptr() + other.offset + b,
        );
        x < y + len && y < x + len
    }
}

/// One step of a device fill: the bytes `(offset, len)` of the input to zero, then a run.
#[derive(Debug, PartialEq, Eq)]
struct FillStep<'r> {
    zero: (u64, u64),
    run: Option<&'r CopyRun>,
}

/// `runs` from `from` (`(what, bytes)`) into `to` in order of destination, each checked
/// against both and no two writing one byte, each after the bytes of `to` before it that
/// no run writes; a last step zeroes those after the last run.
fn plan_fill<'r>(
    runs: &'r [CopyRun],
    from: (&str, u64),
    to: (&str, u64),
) -> Result<Vec<FillStep<'r>>, RuntimeError> {
    let mut order: Vec<&CopyRun> = runs.iter().collect();
    order.sort_by_key(|r| r.dst);
    let mut steps = Vec::with_capacity(order.len() + 1);
    let mut end = 0;
    for r in order {
        let (dst, src, len) = (r.dst as u64, r.src as u64, r.len as u64);
        check_range(from.0, src, len, from.1)?;
        check_range(to.0, dst, len, to.1)?;
        if dst < end {
            return Err(RuntimeError::Engine(format!(
                "{}: two device copies write byte {dst}",
                to.0
            )));
        }
        steps.push(FillStep {
            zero: (end, dst - end),
            run: Some(r),
        });
        end = dst + len;
    }
    steps.push(FillStep {
        zero: (end, to.1 - end),
        run: None,
    });
    Ok(steps)
}

/// Enqueues the copies of `runs` from `from` into `g`'s input `name`: every run checked
/// ([`plan_fill`], and no run reading bytes it writes) before anything is issued; then
/// the ranges no run writes zeroed and one `cuMemcpyDtoDAsync` per run, on the session's
/// stream.
fn fill(
    g: &LoadedGraph,
    name: &str,
    from: &DeviceSpan,
    runs: &[CopyRun],
) -> Result<(), RuntimeError> {
    let to = DeviceSpan::of_io(g, name, format!("prefill input `{name}`"))?;
    let steps = plan_fill(runs, (&from.what, from.bytes), (&to.what, to.bytes))?;
    for r in steps.iter().filter_map(|s| s.run) {
        let (dst, src, len) = (r.dst as u64, r.src as u64, r.len as u64);
        if from.overlaps(src, &to, dst, len) {
            return Err(RuntimeError::Engine(format!(
                "{}: the copy to bytes {dst}..{} reads bytes it writes",
                to.what,
                dst + len
            )));
        }
    }
    for FillStep { zero, run } in steps {
        to.buf.zero(to.offset + zero.0, zero.1)?;
        if let Some(r) = run {
            from.copy_to(&to, r.dst as u64, r.src as u64, r.len as u64)?;
        }
    }
    Ok(())
}

/// One prefill plan, loaded and captured.
pub struct PrefillGraph {
    pub loaded: LoadedGraph,
    captured: StepGraph,
}

impl PrefillGraph {
    /// Fills the graph's input slots from `inputs`, replays it and returns the bytes of
    /// `outputs`: blocking until the replay has run where there are outputs; with none,
    /// only queued on the session's stream (what runs after it on the stream sees its
    /// writes).
    pub fn run(
        &self,
        engine: &CudaEngine,
        inputs: &[(&str, Input)],
        outputs: &[&str],
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        for (name, input) in inputs {
            match input {
                Input::Host(bytes) => self.loaded.write(name, bytes)?,
                Input::Device { from, runs } => fill(&self.loaded, name, from, runs)?,
            }
        }
        self.loaded.shadow_in()?;
        self.captured.replay()?;
        self.loaded.shadow_out()?;
        if outputs.is_empty() {
            return Ok(Vec::new());
        }
        engine.synchronize()?;
        outputs.iter().map(|o| self.loaded.read(o)).collect()
    }

    /// Replays so far (the capture itself runs nothing).
    pub fn replays(&self) -> u64 {
        self.captured.replays()
    }
}

/// Where a prefill runs: batch bucket `b`, prompt bucket `t`, first lane `lane` (a
/// bucket-`b` plan over lanes `lane..lane + b` of the states).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAt {
    pub b: usize,
    pub t: usize,
    pub lane: usize,
}

/// The prefill graphs captured so far, by role and place, and one activation arena per
/// plan (role, batch bucket, prompt bucket) that its graphs at every lane share: they run
/// one at a time on the session's stream, and one plan's kernels leave its arena as they
/// expect it (split-K counters back at zero, its own values elsewhere), which another
/// plan's layout would not.
#[derive(Default)]
pub struct PrefillGraphs {
    graphs: HashMap<(GraphRole, PrefillAt), PrefillGraph>,
    arenas: HashMap<(GraphRole, usize, usize), DeviceArena>,
}

impl PrefillGraphs {
    /// The graph of `plan` (role `role`) at `at`, loaded and captured on first use, in
    /// the plan's arena (allocated by its first graph).
    pub fn get_or_capture(
        &mut self,
        engine: &mut CudaEngine,
        role: GraphRole,
        at: PrefillAt,
        plan: &BucketPlan,
    ) -> Result<&PrefillGraph, RuntimeError> {
        Ok(match self.graphs.entry((role, at)) {
            Entry::Occupied(g) => g.into_mut(),
            Entry::Vacant(slot) => {
                let arena = match self.arenas.entry((role, at.b, at.t)) {
                    Entry::Occupied(a) => a.into_mut(),
                    Entry::Vacant(a) => {
                        a.insert(DeviceArena::new(&engine.dev, plan.arena_bytes.max(256))?)
                    }
                };
                let loaded = engine.load_at(plan, at.lane as u64, Some(arena))?;
                let captured = engine.capture(&loaded)?;
                slot.insert(PrefillGraph { loaded, captured })
            }
        })
    }

    /// The graph of `role` at `at` if it was captured.
    pub fn get(&self, role: GraphRole, at: PrefillAt) -> Option<&PrefillGraph> {
        self.graphs.get(&(role, at))
    }

    /// The role and place of every captured graph.
    pub fn places(&self) -> Vec<(GraphRole, PrefillAt)> {
        self.graphs.keys().copied().collect()
    }

    /// How many prefill graphs were captured.
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Replays of every prefill graph so far.
    pub fn replays(&self) -> u64 {
        self.graphs.values().map(PrefillGraph::replays).sum()
    }

    /// Replays of the `role` graphs at prompt bucket `t` so far, at any batch bucket and
    /// lane.
    pub fn replays_of(&self, role: GraphRole, t: usize) -> u64 {
        self.graphs
            .iter()
            .filter(|((r, at), _)| *r == role && at.t == t)
            .map(|(_, g)| g.replays())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dst: usize, src: usize, len: usize) -> CopyRun {
        CopyRun { dst, src, len }
    }

    #[test]
    fn a_fill_zeroes_what_no_run_writes() {
        let runs = [run(40, 0, 8), run(8, 16, 16)];
        let steps = plan_fill(&runs, ("taps", 64), ("hidden", 64)).unwrap();
        let gaps: Vec<(u64, u64)> = steps.iter().map(|s| s.zero).collect();
        let order: Vec<Option<CopyRun>> = steps.iter().map(|s| s.run.copied()).collect();
        assert_eq!(gaps, vec![(0, 8), (24, 16), (48, 16)]);
        assert_eq!(order, vec![Some(runs[1]), Some(runs[0]), None]);
        let all = [run(0, 0, 64)];
        let whole = plan_fill(&all, ("taps", 64), ("hidden", 64)).unwrap();
        assert_eq!(whole[0].zero, (0, 0));
        assert_eq!(whole[1].zero, (64, 0));
    }

    #[test]
    fn a_fill_outside_its_buffers_names_the_buffer() {
        let e = plan_fill(&[run(0, 60, 8)], ("taps", 64), ("hidden", 64)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "taps: byte range 60..68 is outside the 64-byte buffer"
        );
        let e = plan_fill(&[run(60, 0, 8)], ("taps", 64), ("hidden", 64)).unwrap_err();
        assert!(
            e.to_string().starts_with("hidden: byte range 60..68"),
            "{e}"
        );
        let e = plan_fill(&[run(0, 0, 8), run(4, 8, 8)], ("taps", 64), ("hidden", 64)).unwrap_err();
        assert!(
            e.to_string().contains("two device copies write byte 4"),
            "{e}"
        );
        assert!(plan_fill(&[run(usize::MAX, 0, 8)], ("taps", 64), ("hidden", 64)).is_err());
    }
}
