//! The activation arena of a bucket and the state buffers (KV caches, draft caches,
//! positions) that persist across steps.

use std::collections::BTreeMap;
use std::sync::Arc;

use specc_ir::{Bindings, Graph};

use super::buffer::DeviceBuffer;
use super::device::CudaDevice;
use super::error::CudaError;
use super::table::BufRef;
use crate::RuntimeError;

/// One zero-initialised device arena of `arena_bytes` (codegen's `MemoryPlan::arena_bytes`);
/// graph inputs, outputs and intermediates live at the plan's offsets. A clone shares the
/// buffer.
#[derive(Clone)]
pub struct DeviceArena {
    buf: Arc<DeviceBuffer>,
}

impl DeviceArena {
    pub fn new(dev: &CudaDevice, arena_bytes: u64) -> Result<DeviceArena, RuntimeError> {
        Ok(DeviceArena {
            buf: dev.alloc_zeroed("activation arena", arena_bytes)?,
        })
    }

    pub fn buffer(&self) -> &Arc<DeviceBuffer> {
        &self.buf
    }

    /// Device address of byte 0 (the kernels' arena base).
    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }

    pub fn bytes(&self) -> u64 {
        self.buf.bytes()
    }

    /// Enqueues a copy of an input's bytes to `offset`, ordered before the next replay.
    pub fn write_input(&self, offset: u64, data: &[u8]) -> Result<(), RuntimeError> {
        self.buf.write(offset, data)
    }

    /// The `len` bytes at `offset` once all queued work (replays included) has run.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, RuntimeError> {
        self.buf.read(offset, len)
    }

    /// [`read`](Self::read) into a caller's buffer.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.buf.read_into(offset, out)
    }
}

/// Persistent state buffers by name, zero-initialised.
pub struct StateBuffers {
    by_name: BTreeMap<String, Arc<DeviceBuffer>>,
}

impl StateBuffers {
    /// One buffer per `(name, bytes)`.
    pub fn new<'a>(
        dev: &CudaDevice,
        sizes: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<StateBuffers, RuntimeError> {
        let mut by_name = BTreeMap::new();
        for (name, bytes) in merge_sizes(sizes)? {
            let buf = dev.alloc_zeroed(&format!("state `{name}`"), bytes)?;
            by_name.insert(name, buf);
        }
        Ok(StateBuffers { by_name })
    }

    /// One buffer per `State` of `graph`, sized by its type under `bind` (the bucket whose
    /// shapes the states take; to share states across buckets, pass the largest).
    pub fn for_graph(
        dev: &CudaDevice,
        graph: &Graph,
        bind: &Bindings,
    ) -> Result<StateBuffers, RuntimeError> {
        let sizes = state_sizes(graph, bind)?;
        Self::new(dev, sizes.iter().map(|(n, b)| (n.as_str(), *b)))
    }

    pub fn get(&self, name: &str) -> Result<&Arc<DeviceBuffer>, RuntimeError> {
        Ok(self
            .by_name
            .get(name)
            .ok_or_else(|| CudaError::UnknownState(name.to_string()))?)
    }

    /// State `name` as a pointer-table entry.
    pub fn buf_ref(&self, name: &str) -> Result<BufRef, RuntimeError> {
        Ok(BufRef {
            buf: self.get(name)?.clone(),
            offset: 0,
        })
    }

    /// Device address of state `name`.
    pub fn ptr(&self, name: &str) -> Result<u64, RuntimeError> {
        Ok(self.get(name)?.ptr())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<DeviceBuffer>)> {
        self.by_name.iter().map(|(n, b)| (n.as_str(), b))
    }

    /// Enqueues zeroing of every state (forgets all sequences).
    pub fn zero_all(&self) -> Result<(), RuntimeError> {
        for b in self.by_name.values() {
            b.zero(0, b.bytes())?;
        }
        Ok(())
    }

    /// Total bytes of all states.
    pub fn total_bytes(&self) -> u64 {
        self.by_name.values().map(|b| b.bytes()).sum()
    }
}

/// `(name, bytes)` of every state of `graph` under `bind`, one per name.
pub fn state_sizes(graph: &Graph, bind: &Bindings) -> Result<Vec<(String, u64)>, RuntimeError> {
    let mut sizes = Vec::new();
    for (_, name, ty) in graph.states() {
        let bytes = ty.bytes(bind).ok_or_else(|| CudaError::UnboundState {
            name: name.to_string(),
            ty: ty.to_string(),
        })?;
        sizes.push((name.to_string(), bytes));
    }
    Ok(merge_sizes(sizes.iter().map(|(n, b)| (n.as_str(), *b)))?
        .into_iter()
        .collect())
}

/// Deduplicates by name; the same name with two sizes is an error.
fn merge_sizes<'a>(
    sizes: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<BTreeMap<String, u64>, CudaError> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for (name, bytes) in sizes {
        match m.get(name) {
            Some(&a) if a != bytes => {
                return Err(CudaError::StateConflict {
                    name: name.to_string(),
                    a,
                    b: bytes,
                })
            }
            Some(_) => {}
            None => {
                m.insert(name.to_string(), bytes);
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_dedups_and_rejects_conflicts() {
        let m = merge_sizes([("k", 10), ("v", 20), ("k", 10)]).unwrap();
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![("k".into(), 10), ("v".into(), 20)]
        );
        assert!(matches!(
            merge_sizes([("k", 10), ("k", 12)]),
            Err(CudaError::StateConflict { a: 10, b: 12, .. })
        ));
    }

    #[test]
    fn state_sizes_follow_the_bucket() {
        use specc_ir::{BucketDim, DType, Dim, Op, TensorType};
        let mut g = Graph::new("states");
        let ty = TensorType::new(
            DType::BF16,
            [BucketDim::B.into(), BucketDim::Ctx.into(), Dim::Static(8)],
        );
        g.add(
            Op::State {
                name: "kv".into(),
                ty,
            },
            &[],
        )
        .unwrap();
        let sizes = state_sizes(&g, &Bindings::new(2, 1, 16)).unwrap();
        assert_eq!(sizes, vec![("kv".to_string(), 2 * 16 * 8 * 2)]);
        let mut unbound = Bindings::default();
        unbound.set(BucketDim::B, 2);
        assert!(matches!(
            state_sizes(&g, &unbound),
            Err(RuntimeError::Cuda(CudaError::UnboundState { .. }))
        ));
    }
}
