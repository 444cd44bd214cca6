//! Device tables of pointers: the kernel ABI's `void* const* bufs`, one slot per weight or
//! persistent buffer, in the order the generated kernels index them.

use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::device::CudaDevice;
use super::error::CudaError;
use crate::RuntimeError;

/// Alignment every table entry must have (kernels issue 16-byte vector loads through them).
pub const TABLE_ENTRY_ALIGN: u64 = 16;

/// An address inside a buffer, holding the buffer.
#[derive(Clone, Debug)]
pub struct BufRef {
    pub buf: Arc<DeviceBuffer>,
    pub offset: u64,
}

impl BufRef {
    pub fn addr(&self) -> u64 {
        self.buf.ptr() + self.offset
    }
}

/// Builds a device array of `u64` addresses, entry `i` = `entries[i]`. Each entry must lie in
/// its buffer and be 16-byte aligned. The table holds every buffer it points into, so
/// retaining the table retains them.
pub fn pointer_table(
    dev: &CudaDevice,
    label: &str,
    entries: &[BufRef],
) -> Result<Arc<DeviceBuffer>, RuntimeError> {
    aligned_table(dev, label, entries, TABLE_ENTRY_ALIGN)
}

/// [`pointer_table`] with entries aligned to `align` bytes only: kernel operand tables, whose
/// entries are 16-byte aligned bases plus element offsets (each kernel picks its vector width
/// from its operands' offsets).
pub fn operand_table(
    dev: &CudaDevice,
    label: &str,
    entries: &[BufRef],
) -> Result<Arc<DeviceBuffer>, RuntimeError> {
    aligned_table(dev, label, entries, 1)
}

fn aligned_table(
    dev: &CudaDevice,
    label: &str,
    entries: &[BufRef],
    align: u64,
) -> Result<Arc<DeviceBuffer>, RuntimeError> {
    let mut bytes = Vec::with_capacity(entries.len() * 8);
    let mut deps: Vec<Arc<DeviceBuffer>> = Vec::new();
    for (slot, e) in entries.iter().enumerate() {
        let addr = e.buf.addr(e.offset, 0)?;
        if addr % align != 0 {
            return Err(CudaError::BadTableEntry {
                table: label.to_string(),
                slot,
                reason: format!(
                    "{} + {} is not {align}-byte aligned",
                    e.buf.label(),
                    e.offset
                ),
            }
            .into());
        }
        bytes.extend_from_slice(&addr.to_le_bytes());
        if !deps.iter().any(|d| Arc::ptr_eq(d, &e.buf)) {
            deps.push(e.buf.clone());
        }
    }
    let table =
        DeviceBuffer::alloc_uninit(dev.stream(), label, bytes.len() as u64)?.with_deps(deps);
    table.write(0, &bytes)?;
    Ok(Arc::new(table))
}
