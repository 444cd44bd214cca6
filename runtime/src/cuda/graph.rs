//! One CUDA graph per bucket step: captured once, replayed with one `cuGraphLaunch`.
//!
//! Capture runs on the device's one stream in thread-local mode, so any call on this thread
//! that cannot be captured (a synchronous copy, an allocation, a stream sync) fails the
//! capture instead of silently running eagerly. A guard ends the capture on every exit
//! path — error or panic — so the stream is never left capturing.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{result, sys, CudaGraph, CudaStream};

use super::module::KernelFunction;

use super::buffer::DeviceBuffer;
use super::device::{CudaDevice, LaunchCounters};
use super::error::{CudaError, DriverResultExt};
use super::launch::{launch_all, PreparedLaunch};
use crate::RuntimeError;

/// Everything a graph's nodes refer to. The graph owns it, so no buffer or module it
/// touches can go away while the graph exists.
#[derive(Clone, Debug, Default)]
pub struct Retained {
    /// Launches in issue order; they hold their functions (and so their modules) and the
    /// buffers their `Buf` parameters name.
    pub launches: Vec<PreparedLaunch>,
    /// Buffers reached other than through `Buf` parameters: the arena, states, weight slab
    /// and tables, the token ring, and anything passed as a raw `Ptr`.
    pub buffers: Vec<Arc<DeviceBuffer>>,
    /// Functions launched other than through `launches`.
    pub functions: Vec<KernelFunction>,
}

/// A captured, instantiated step.
///
/// Invariant: every device address baked into the graph belongs to a buffer in `retained`
/// (or to one those buffers hold), and the graph is destroyed before `retained` is dropped.
pub struct StepGraph {
    graph: CudaGraph,
    retained: Retained,
    stream: Arc<CudaStream>,
    counters: Arc<LaunchCounters>,
    nodes: usize,
    programmatic_edges: Option<usize>,
    replays: Cell<u64>,
}

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// not concurrent. `StepGraph` is `Send` but not `Sync` (its `Cell` forbids sharing), so only
// the one thread that owns it can replay it; every call binds the context to that thread.
unsafe impl Send for StepGraph {}

/// Ends an open capture unless disarmed; a graph it ends is destroyed, not instantiated.
struct CaptureGuard<'a> {
    stream: &'a CudaStream,
    armed: bool,
}

impl CaptureGuard<'_> {
    fn abort(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        let ctx = self.stream.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: the stream is live and this thread began capture on it; ending capture is
        // valid whether or not the capture was invalidated, and the graph it returns (if any)
        // is owned by us and destroyed exactly once here.
        unsafe {
            if let Ok(g) = result::stream::end_capture(self.stream.cu_stream()) {
                if !g.is_null() {
                    ctx.record_err(result::graph::destroy(g));
                }
            }
        }
    }
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        self.abort();
    }
}

impl StepGraph {
    /// Captures whatever `issue` enqueues on the device's stream into one graph,
    /// instantiates and uploads it. `issue` gets the device and the retained set (typically
    /// `|dev, r| launch_all(dev, &r.launches)`). On any error or panic in `issue`, capture
    /// is ended and nothing is kept.
    pub fn capture<F>(
        dev: &CudaDevice,
        retained: Retained,
        issue: F,
    ) -> Result<StepGraph, RuntimeError>
    where
        F: FnOnce(&CudaDevice, &Retained) -> Result<(), RuntimeError>,
    {
        let stream = dev.stream();
        let status = stream
            .capture_status()
            .during("querying the stream's capture status")?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(CudaError::Capture(format!(
                "the stream is already capturing ({status:?})"
            ))
            .into());
        }
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("beginning stream capture")?;
        let mut guard = CaptureGuard {
            stream,
            armed: true,
        };
        if let Err(e) = issue(dev, &retained) {
            guard.abort();
            return Err(e);
        }
        guard.armed = false;
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(|e| {
                CudaError::Capture(format!(
                    "ending capture / instantiating: {e} (a call in the capture was not capturable, \
                     e.g. a synchronous copy, an allocation or a sync on the capturing thread)"
                ))
            })?
            .ok_or_else(|| {
                CudaError::Capture("the capture was invalidated and produced no graph".into())
            })?;
        let nodes = node_count(&graph).during("counting graph nodes")?;
        let programmatic_edges = programmatic_edge_count(&graph);
        graph.upload().during("uploading the graph")?;
        Ok(StepGraph {
            graph,
            retained,
            stream: stream.clone(),
            counters: dev.counters().clone(),
            nodes,
            programmatic_edges,
            replays: Cell::new(0),
        })
    }

    /// Captures `launches` in order, retaining them and `buffers`.
    pub fn from_launches(
        dev: &CudaDevice,
        launches: Vec<PreparedLaunch>,
        buffers: Vec<Arc<DeviceBuffer>>,
    ) -> Result<StepGraph, RuntimeError> {
        let retained = Retained {
            launches,
            buffers,
            functions: Vec::new(),
        };
        Self::capture(dev, retained, |dev, r| launch_all(dev, &r.launches))
    }

    /// Enqueues one replay of the whole step: a single `cuGraphLaunch` on the stream.
    pub fn replay(&self) -> Result<(), RuntimeError> {
        self.graph.launch().during("launching the step graph")?;
        self.replays.set(self.replays.get() + 1);
        self.counters.add_graph_launch();
        Ok(())
    }

    /// Replays of this graph so far.
    pub fn replays(&self) -> u64 {
        self.replays.get()
    }

    /// Nodes in the graph (one per captured kernel or copy).
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Edges of the graph that let a kernel start before its predecessor ends (programmatic
    /// dependent launch: one per PDL launch that follows a kernel), or `None` where the
    /// driver cannot say.
    pub fn programmatic_edges(&self) -> Option<usize> {
        self.programmatic_edges
    }

    pub fn retained(&self) -> &Retained {
        &self.retained
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // Replays may be in flight; modules and buffers in `retained` must outlive them.
        let ctx = self.stream.context();
        ctx.record_err(self.stream.synchronize());
    }
}

fn node_count(graph: &CudaGraph) -> Result<usize, cudarc::driver::DriverError> {
    let mut n = 0usize;
    // SAFETY: the graph is live (owned by `graph`); with a null node array the driver only
    // writes the count through a valid pointer.
    unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) }.result()?;
    Ok(n)
}

/// Programmatic edges of `graph` (`cuGraphGetEdges_v2`, CUDA 12.3+), or `None` where the
/// driver lacks the query or it fails.
fn programmatic_edge_count(graph: &CudaGraph) -> Option<usize> {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // cudarc panics on a call to a symbol the loaded driver lacks, so look it up first.
    // SAFETY: `culib()` returns the already loaded driver library (a graph exists); looking
    // up a symbol by name does not call it.
    let available = *AVAILABLE.get_or_init(|| unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuGraphGetEdges_v2\0")
            .is_ok()
    });
    if !available {
        return None;
    }
    let g = graph.cu_graph();
    let mut n = 0usize;
    let (no_nodes, no_data) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the graph is live; with null arrays the driver only writes the edge count.
    unsafe { sys::cuGraphGetEdges_v2(g, no_nodes, no_nodes, no_data, &mut n) }
        .result()
        .ok()?;
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    // SAFETY: `CUgraphEdgeData` is plain bytes; all-zero is the default edge.
    let mut data = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    // SAFETY: the three arrays hold `n` entries each, the count the driver reported for this
    // unchanged graph; it writes at most `n` and updates `n`.
    unsafe {
        sys::cuGraphGetEdges_v2(
            g,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        )
    }
    .result()
    .ok()?;
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    Some(
        data[..n.min(data.len())]
            .iter()
            .filter(|e| e.type_ == programmatic)
            .count(),
    )
}
