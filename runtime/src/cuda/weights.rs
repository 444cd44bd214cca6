//! Weights on the device: one slab, each tensor at a 256-byte aligned offset, uploaded
//! through two pinned staging buffers so host copies (page faults on the safetensors mmap)
//! overlap the DMA.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaEvent};
use specc_ir::DType;

use super::buffer::{DeviceBuffer, PinnedBuffer};
use super::device::CudaDevice;
use super::error::{CudaError, DriverResultExt};
use super::table::{pointer_table, BufRef};
use crate::RuntimeError;

/// Offset alignment of each tensor in the slab (matches the codegen arena's alignment).
pub const WEIGHT_ALIGN: u64 = 256;

/// Size of each of the two pinned staging buffers.
const STAGE_BYTES: usize = 64 << 20;

/// One tensor to upload: raw little-endian bytes as stored in the checkpoint (for
/// `Int4Group`, the packed nibbles alone, as [`DType::storage_bytes`] counts them; the
/// scales are a tensor of their own).
#[derive(Clone, Copy, Debug)]
pub struct HostTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl<'a> From<(&'a str, DType, &'a [usize], &'a [u8])> for HostTensor<'a> {
    fn from((name, dtype, shape, data): (&'a str, DType, &'a [usize], &'a [u8])) -> Self {
        HostTensor {
            name,
            dtype,
            shape,
            data,
        }
    }
}

/// Where one weight lives in the slab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightEntry {
    pub offset: u64,
    pub bytes: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// All weights of a model on the device.
pub struct DeviceWeights {
    slab: Arc<DeviceBuffer>,
    entries: HashMap<String, WeightEntry>,
    /// Names in upload order.
    order: Vec<String>,
}

/// Offsets of tensors of the given sizes packed in order, each aligned to [`WEIGHT_ALIGN`],
/// and the slab size (a multiple of the alignment).
pub fn slab_layout(sizes: impl IntoIterator<Item = u64>) -> (Vec<u64>, u64) {
    let mut end = 0u64;
    let offsets = sizes
        .into_iter()
        .map(|s| {
            let o = end.next_multiple_of(WEIGHT_ALIGN);
            end = o + s;
            o
        })
        .collect();
    (offsets, end.next_multiple_of(WEIGHT_ALIGN))
}

fn expected_bytes(dtype: DType, shape: &[usize]) -> u64 {
    let numel: u64 = shape.iter().map(|&d| d as u64).product();
    dtype.storage_bytes(numel)
}

impl DeviceWeights {
    /// Uploads `tensors` into one slab, in the given order. Sizes are checked against dtype
    /// and shape, free memory is checked before allocating, and with `progress` a line on
    /// stderr shows bytes copied over the total. Returns once every byte is on the device.
    pub fn upload<'a, T, I>(
        dev: &CudaDevice,
        tensors: I,
        progress: bool,
    ) -> Result<DeviceWeights, RuntimeError>
    where
        T: Into<HostTensor<'a>>,
        I: IntoIterator<Item = T>,
    {
        Self::upload_streamed(dev, tensors, progress, |_| Ok(()), |_| {})
    }

    /// [`Self::upload`] with hooks around each tensor `i` (in the given order): `staging(i)`
    /// runs just before its bytes are read (a failure stops the upload), `staged(i)` once
    /// they are copied out of host memory (the caller may drop their pages).
    pub fn upload_streamed<'a, T, I>(
        dev: &CudaDevice,
        tensors: I,
        progress: bool,
        mut staging: impl FnMut(usize) -> Result<(), RuntimeError>,
        mut staged: impl FnMut(usize),
    ) -> Result<DeviceWeights, RuntimeError>
    where
        T: Into<HostTensor<'a>>,
        I: IntoIterator<Item = T>,
    {
        let tensors: Vec<HostTensor<'a>> = tensors.into_iter().map(Into::into).collect();
        let mut entries = HashMap::with_capacity(tensors.len());
        for t in &tensors {
            let want = expected_bytes(t.dtype, t.shape);
            if t.data.len() as u64 != want {
                return Err(CudaError::WeightSize {
                    name: t.name.to_string(),
                    dtype: t.dtype.to_string(),
                    shape: t.shape.to_vec(),
                    got: t.data.len() as u64,
                    want,
                }
                .into());
            }
        }
        let (offsets, total) = slab_layout(tensors.iter().map(|t| t.data.len() as u64));
        for (t, &offset) in tensors.iter().zip(&offsets) {
            let e = WeightEntry {
                offset,
                bytes: t.data.len() as u64,
                dtype: t.dtype,
                shape: t.shape.to_vec(),
            };
            if entries.insert(t.name.to_string(), e).is_some() {
                return Err(CudaError::DuplicateWeight(t.name.to_string()).into());
            }
        }
        let (free, total_mem) = dev.mem_info()?;
        if total > free {
            return Err(CudaError::OutOfMemory {
                what: format!("the weights slab ({} tensors)", tensors.len()),
                requested: total,
                free,
                total: total_mem,
            }
            .into());
        }
        let slab = DeviceBuffer::alloc_uninit(dev.stream(), "weights slab", total)?;
        let mut stager = Stager::new(dev, &slab, total, progress)?;
        for (i, (t, &offset)) in tensors.iter().zip(&offsets).enumerate() {
            staging(i)?;
            // Padding is written as zeros so the whole slab is defined.
            stager.pad_to(offset)?;
            // `push` copies into pinned staging before it returns: the host bytes are free.
            stager.push(t.data)?;
            staged(i);
        }
        stager.pad_to(total)?;
        stager.finish()?;
        Ok(DeviceWeights {
            slab: Arc::new(slab),
            entries,
            order: tensors.iter().map(|t| t.name.to_string()).collect(),
        })
    }

    /// The slab every weight lives in.
    pub fn slab(&self) -> &Arc<DeviceBuffer> {
        &self.slab
    }

    pub fn entry(&self, name: &str) -> Option<&WeightEntry> {
        self.entries.get(name)
    }

    /// Names in upload order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// Device address of weight `name`.
    pub fn ptr(&self, name: &str) -> Result<u64, RuntimeError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| CudaError::UnknownWeight(name.to_string()))?;
        Ok(self.slab.ptr() + e.offset)
    }

    /// Weight `name` as a table entry (see [`pointer_table`]).
    pub fn buf_ref(&self, name: &str) -> Result<BufRef, RuntimeError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| CudaError::UnknownWeight(name.to_string()))?;
        Ok(BufRef {
            buf: self.slab.clone(),
            offset: e.offset,
        })
    }

    /// A device table of weight addresses in the caller's order. Kernels usually take one
    /// table of weights and states together: build it with [`pointer_table`] from
    /// [`buf_ref`](Self::buf_ref) and [`StateBuffers::buf_ref`](super::StateBuffers::buf_ref).
    pub fn table(
        &self,
        dev: &CudaDevice,
        order: &[&str],
    ) -> Result<Arc<DeviceBuffer>, RuntimeError> {
        let entries = order
            .iter()
            .map(|n| self.buf_ref(n))
            .collect::<Result<Vec<_>, _>>()?;
        pointer_table(dev, "weight pointer table", &entries)
    }
}

/// Streams bytes into consecutive slab offsets through two pinned buffers.
///
/// Invariant: buffer `i` is refilled only after `events[i]` (recorded after its last copy)
/// completed; `done` bytes of the slab have been queued.
struct Stager<'s> {
    slab: &'s DeviceBuffer,
    stream: &'s Arc<cudarc::driver::CudaStream>,
    bufs: [PinnedBuffer; 2],
    events: [CudaEvent; 2],
    cur: usize,
    fill: usize,
    done: u64,
    total: u64,
    progress: Option<u64>,
}

impl<'s> Stager<'s> {
    fn new(
        dev: &'s CudaDevice,
        slab: &'s DeviceBuffer,
        total: u64,
        progress: bool,
    ) -> Result<Self, CudaError> {
        let size = (total as usize).clamp(1, STAGE_BYTES);
        let stream = dev.stream();
        let event = || {
            dev.context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .during("creating an upload event")
        };
        Ok(Stager {
            slab,
            stream,
            bufs: [
                PinnedBuffer::new(stream, "weight staging", size, true)?,
                PinnedBuffer::new(stream, "weight staging", size, true)?,
            ],
            events: [event()?, event()?],
            cur: 0,
            fill: 0,
            done: 0,
            total,
            progress: progress.then_some(u64::MAX),
        })
    }

    fn push(&mut self, mut data: &[u8]) -> Result<(), CudaError> {
        while !data.is_empty() {
            let room = self.bufs[self.cur].len() - self.fill;
            let n = room.min(data.len());
            let fill = self.fill;
            self.bufs[self.cur].as_mut_slice()[fill..fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill == self.bufs[self.cur].len() {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Appends zeros up to slab offset `to`.
    fn pad_to(&mut self, to: u64) -> Result<(), CudaError> {
        const ZEROS: [u8; WEIGHT_ALIGN as usize] = [0; WEIGHT_ALIGN as usize];
        let mut left = to - (self.done + self.fill as u64);
        while left > 0 {
            let n = left.min(ZEROS.len() as u64);
            self.push(&ZEROS[..n as usize])?;
            left -= n;
        }
        Ok(())
    }

    /// Queues the current buffer's bytes to the slab and switches to the other buffer,
    /// waiting for its previous copy first.
    fn flush(&mut self) -> Result<(), CudaError> {
        if self.fill == 0 {
            return Ok(());
        }
        let n = self.fill;
        let dst = self.slab.ptr() + self.done;
        debug_assert!(self.done + n as u64 <= self.slab.bytes().next_multiple_of(WEIGHT_ALIGN));
        let src = &self.bufs[self.cur].as_slice()[..n];
        // SAFETY: `dst..dst + n` lies inside the slab (the stager writes exactly `total`
        // bytes, the slab's size); `src` is pinned memory that stays untouched until
        // `events[cur]`, recorded right after this copy, has completed.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .during(format!("uploading {n} bytes of weights"))?;
        self.events[self.cur]
            .record(self.stream)
            .during("recording an upload event")?;
        self.done += n as u64;
        self.fill = 0;
        self.cur ^= 1;
        self.events[self.cur]
            .synchronize()
            .during("waiting for an upload copy")?;
        self.report();
        Ok(())
    }

    fn report(&mut self) {
        let Some(last) = self.progress else { return };
        let pct = (self.done * 100).checked_div(self.total).unwrap_or(100);
        if pct != last {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            eprint!(
                "\ruploading weights: {:.0} / {:.0} MiB ({pct}%)",
                mib(self.done),
                mib(self.total)
            );
            let _ = std::io::stderr().flush();
            self.progress = Some(pct);
        }
    }

    fn finish(mut self) -> Result<(), CudaError> {
        self.flush()?;
        self.stream
            .synchronize()
            .during("waiting for the weight upload")?;
        if self.progress.is_some() {
            eprintln!();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_offsets_are_aligned_and_packed() {
        let (offs, total) = slab_layout([10, 256, 1, 0, 300]);
        assert_eq!(offs, vec![0, 256, 512, 768, 768]);
        assert_eq!(total, 768 + 512);
        assert!(offs.iter().all(|o| o % WEIGHT_ALIGN == 0));
        assert_eq!(slab_layout([]), (vec![], 0));
    }

    #[test]
    fn expected_sizes_follow_dtype() {
        assert_eq!(expected_bytes(DType::BF16, &[4, 8]), 64);
        assert_eq!(expected_bytes(DType::Fp8E4M3, &[3]), 3);
        assert_eq!(expected_bytes(DType::Int4Group { group: 32 }, &[2, 64]), 64);
    }
}
