//! The token ring: the step graph's emit kernel appends `i32` words on the device; after
//! each replay the host queues an asynchronous copy into a pinned mirror and records an
//! event, and reads mirrors whose events completed — so the host never waits inside a step
//! and may queue several steps before reading.
//!
//! Device layout (one buffer, `i32` words):
//! - word 0: the write cursor, the total number of words ever emitted, as `u32` modulo 2^32;
//! - word 1: the capacity (a power of two); words 2..4: zero;
//! - words `RING_HEADER_WORDS..`: the slots; word number `n` of the stream lives in slot
//!   `n & (capacity - 1)`.
//!
//! An emitter writes its words into their slots and then advances the cursor, within the
//! step. What the words mean (sequence ids, counts, tokens) is the emit kernel's format.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaEvent, CudaStream};

use super::buffer::{DeviceBuffer, PinnedBuffer};
use super::device::CudaDevice;
use super::error::{CudaError, DriverResultExt};
use crate::RuntimeError;

/// Words before the first slot (keeps slots 16-byte aligned).
pub const RING_HEADER_WORDS: usize = 4;

/// Mirrors (steps whose copies may be in flight at once) unless told otherwise.
pub const DEFAULT_RING_DEPTH: usize = 4;

/// Device ring of emitted words with pinned host mirrors.
///
/// Invariants: `pending` lists, oldest first, the mirrors with a copy queued and not yet
/// read; a mirror is read only after its event completed and is refilled only after it was
/// read; `read` counts the words handed out (mod 2^32).
pub struct TokenRing {
    buf: Arc<DeviceBuffer>,
    capacity: u32,
    stream: Arc<CudaStream>,
    mirrors: Vec<PinnedBuffer>,
    events: Vec<CudaEvent>,
    pending: VecDeque<usize>,
    next: usize,
    read: u32,
    ready: Vec<i32>,
}

impl TokenRing {
    /// A zeroed ring of `capacity` words (a power of two) with `depth` host mirrors.
    pub fn new(dev: &CudaDevice, capacity: u32, depth: usize) -> Result<TokenRing, RuntimeError> {
        if capacity == 0 || !capacity.is_power_of_two() {
            return Err(CudaError::RingCapacity(u64::from(capacity)).into());
        }
        let words = RING_HEADER_WORDS + capacity as usize;
        let buf = dev.alloc_zeroed("token ring", (words * 4) as u64)?;
        buf.write(0, &header(0, capacity))?;
        let depth = depth.max(1);
        let mut mirrors = Vec::with_capacity(depth);
        let mut events = Vec::with_capacity(depth);
        for _ in 0..depth {
            mirrors.push(PinnedBuffer::new(
                dev.stream(),
                "token ring mirror",
                words * 4,
                false,
            )?);
            events.push(
                dev.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .during("creating a ring event")?,
            );
        }
        Ok(TokenRing {
            buf,
            capacity,
            stream: dev.stream().clone(),
            mirrors,
            events,
            pending: VecDeque::new(),
            next: 0,
            read: 0,
            ready: Vec::new(),
        })
    }

    /// The device buffer (retain it in the step graph).
    pub fn buffer(&self) -> &Arc<DeviceBuffer> {
        &self.buf
    }

    /// Device address of the cursor word (word 0); the slots follow at
    /// [`slots_ptr`](Self::slots_ptr).
    pub fn cursor_ptr(&self) -> u64 {
        self.buf.ptr()
    }

    pub fn slots_ptr(&self) -> u64 {
        self.buf.ptr() + (RING_HEADER_WORDS * 4) as u64
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Queues, after everything queued so far (the replay just issued), a copy of the ring
    /// into a free mirror and an event. If every mirror is pending, the oldest is read first
    /// (blocking until its copy is done).
    pub fn after_replay(&mut self) -> Result<(), RuntimeError> {
        if self.pending.len() == self.mirrors.len() {
            self.harvest_front(true)?;
        }
        let m = self.next;
        self.next = (self.next + 1) % self.mirrors.len();
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let mirror = self.mirrors[m].as_mut_slice();
        // SAFETY: the mirror is pinned, as large as the device buffer (both hold the header
        // and `capacity` slots) and not pending, so nothing else reads or copies into it until
        // `events[m]`, recorded next, completes.
        unsafe { result::memcpy_dtoh_async(mirror, self.buf.ptr(), self.stream.cu_stream()) }
            .during("copying the token ring to the host")?;
        self.events[m]
            .record(&self.stream)
            .during("recording the ring event")?;
        self.pending.push_back(m);
        Ok(())
    }

    /// Words emitted by steps whose copies have completed, without blocking.
    pub fn poll(&mut self) -> Result<Vec<i32>, RuntimeError> {
        while !self.pending.is_empty() && self.harvest_front(false)? {}
        Ok(std::mem::take(&mut self.ready))
    }

    /// Words emitted by every step queued so far; blocks until their copies completed.
    pub fn wait(&mut self) -> Result<Vec<i32>, RuntimeError> {
        while !self.pending.is_empty() {
            self.harvest_front(true)?;
        }
        Ok(std::mem::take(&mut self.ready))
    }

    /// Empties the ring on device and host (waits for queued copies first; words not yet
    /// read are dropped). Ordered on the stream before the next replay.
    pub fn reset(&mut self) -> Result<(), RuntimeError> {
        self.wait()?;
        self.buf.write(0, &header(0, self.capacity))?;
        self.read = 0;
        self.ready.clear();
        Ok(())
    }

    /// Reads the oldest pending mirror if its copy is done (or, with `block`, once it is).
    /// Returns whether it was read.
    fn harvest_front(&mut self, block: bool) -> Result<bool, RuntimeError> {
        let Some(&m) = self.pending.front() else {
            return Ok(false);
        };
        if block {
            self.events[m]
                .synchronize()
                .during("waiting for the token ring copy")?;
        } else if !self.events[m]
            .try_is_complete()
            .during("querying the token ring copy")?
        {
            return Ok(false);
        }
        self.pending.pop_front();
        let words = decode_words(self.mirrors[m].as_slice());
        let cursor = words[0] as u32;
        let new = take_new(self.read, cursor, &words[RING_HEADER_WORDS..])?;
        self.read = cursor;
        self.ready.extend_from_slice(&new);
        Ok(true)
    }
}

fn header(cursor: u32, capacity: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(RING_HEADER_WORDS * 4);
    h.extend_from_slice(&cursor.to_le_bytes());
    h.extend_from_slice(&capacity.to_le_bytes());
    h.resize(RING_HEADER_WORDS * 4, 0);
    h
}

fn decode_words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Words `read..cursor` (mod 2^32) of a snapshot of the slots.
fn take_new(read: u32, cursor: u32, slots: &[i32]) -> Result<Vec<i32>, CudaError> {
    let cap = slots.len() as u64;
    let unread = u64::from(cursor.wrapping_sub(read));
    if unread > cap {
        return Err(CudaError::RingOverflow {
            unread,
            capacity: cap,
        });
    }
    let mask = (cap - 1) as u32;
    Ok((0..unread as u32)
        .map(|i| slots[(read.wrapping_add(i) & mask) as usize])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_words_since_last_read_with_wraparound() {
        // Capacity 4; words 0..6 emitted, so slots hold words 4,5,2,3 (slot = n & 3).
        let slots = [4, 5, 2, 3];
        assert_eq!(take_new(2, 6, &slots).unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(take_new(6, 6, &slots).unwrap(), Vec::<i32>::new());
        assert!(matches!(
            take_new(1, 6, &slots),
            Err(CudaError::RingOverflow {
                unread: 5,
                capacity: 4
            })
        ));
    }

    #[test]
    fn cursor_wraps_modulo_2_32() {
        let slots = [10, 11, 12, 13];
        // Words u32::MAX-1, u32::MAX, 0, 1 live in slots 2, 3, 0, 1.
        let got = take_new(u32::MAX - 1, 2, &slots).unwrap();
        assert_eq!(got, vec![12, 13, 10, 11]);
    }

    #[test]
    fn header_layout() {
        let h = header(7, 64);
        assert_eq!(decode_words(&h), vec![7, 64, 0, 0]);
    }
}
