//! The token ring: the step graph's emit writes tokens on the device; after each replay the
//! host queues an asynchronous copy into a pinned mirror and records an event, and reads
//! mirrors whose events completed — so the host never waits inside a step and may queue
//! several steps before reading.
//!
//! Device layout (the step graph's `spec.ring` and `spec.emitted` states, all `i32`):
//! - `ring[B, R]`: lane `b`'s token number `e` (counting from 0 since the lane was reset)
//!   lives at `ring[b * R + e % R]`;
//! - `emitted[B]`: how many tokens lane `b` has emitted; the step writes the tokens first
//!   and advances the count in the same step.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaEvent, CudaStream};

use super::buffer::{DeviceBuffer, PinnedBuffer};
use super::device::CudaDevice;
use super::error::{CudaError, DriverResultExt};
use crate::RuntimeError;

/// Mirrors (steps whose copies may be in flight at once) unless told otherwise.
pub const DEFAULT_RING_DEPTH: usize = 4;

/// Per-lane device rings of emitted tokens with pinned host mirrors.
///
/// Invariants: `pending` lists, oldest first, the mirrors with copies queued and not yet
/// read; a mirror is read only after its event completed and refilled only after it was
/// read; `read[b]` counts lane `b`'s tokens handed out (or drained into `ready`).
pub struct TokenRing {
    ring: Arc<DeviceBuffer>,
    emitted: Arc<DeviceBuffer>,
    lanes: usize,
    capacity: usize,
    stream: Arc<CudaStream>,
    mirrors: Vec<PinnedBuffer>,
    events: Vec<CudaEvent>,
    pending: VecDeque<usize>,
    next: usize,
    read: Vec<u32>,
    ready: Vec<Vec<i32>>,
    /// Steps whose tokens are in `ready`.
    harvested: usize,
    /// The step graph's `spec.budget` state (`i32[lanes]`), copied with the counts where set
    /// ([`TokenRing::track_budget`]).
    budget: Option<Arc<DeviceBuffer>>,
    /// Per lane, whether its budget was above 0 after the newest step read (true for a lane
    /// reset since).
    live: Vec<bool>,
}

impl TokenRing {
    /// A ring over its own zeroed buffers: `lanes × capacity` token slots and `lanes` counts.
    pub fn new(
        dev: &CudaDevice,
        lanes: usize,
        capacity: usize,
        depth: usize,
    ) -> Result<TokenRing, RuntimeError> {
        let ring = dev.alloc_zeroed("token ring", (lanes * capacity * 4) as u64)?;
        let emitted = dev.alloc_zeroed("emitted counts", (lanes * 4) as u64)?;
        Self::from_states(dev, ring, emitted, lanes, capacity, depth)
    }

    /// A ring over the step graph's state buffers `ring` (`i32[lanes, capacity]`) and
    /// `emitted` (`i32[lanes]`).
    pub fn from_states(
        dev: &CudaDevice,
        ring: Arc<DeviceBuffer>,
        emitted: Arc<DeviceBuffer>,
        lanes: usize,
        capacity: usize,
        depth: usize,
    ) -> Result<TokenRing, RuntimeError> {
        if capacity == 0 || lanes == 0 {
            return Err(CudaError::RingShape {
                lanes,
                capacity,
                reason: "needs at least one lane and one slot".into(),
            }
            .into());
        }
        let (ring_bytes, count_bytes) = ((lanes * capacity * 4) as u64, (lanes * 4) as u64);
        if ring.bytes() < ring_bytes || emitted.bytes() < count_bytes {
            return Err(CudaError::RingShape {
                lanes,
                capacity,
                reason: format!(
                    "buffers of {} and {} bytes are smaller than the {ring_bytes} and {count_bytes} the shape needs",
                    ring.bytes(),
                    emitted.bytes()
                ),
            }
            .into());
        }
        let depth = depth.max(1);
        let mut mirrors = Vec::with_capacity(depth);
        let mut events = Vec::with_capacity(depth);
        for _ in 0..depth {
            // The counts, then room for the budgets.
            let bytes = (ring_bytes + 2 * count_bytes) as usize;
            mirrors.push(PinnedBuffer::new(
                dev.stream(),
                "token ring mirror",
                bytes,
                false,
            )?);
            events.push(
                dev.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .during("creating a ring event")?,
            );
        }
        Ok(TokenRing {
            ring,
            emitted,
            lanes,
            capacity,
            stream: dev.stream().clone(),
            mirrors,
            events,
            pending: VecDeque::new(),
            next: 0,
            read: vec![0; lanes],
            ready: vec![Vec::new(); lanes],
            harvested: 0,
            budget: None,
            live: vec![true; lanes],
        })
    }

    /// Copies `budget` (`i32[lanes]`, the step's remaining tokens per lane) with every
    /// step's tokens, so [`TokenRing::live`] knows which lanes ended without a read of the
    /// device that would wait for queued steps.
    pub fn track_budget(&mut self, budget: Arc<DeviceBuffer>) -> Result<(), RuntimeError> {
        if budget.bytes() < (self.lanes * 4) as u64 {
            return Err(CudaError::RingShape {
                lanes: self.lanes,
                capacity: self.capacity,
                reason: format!("a budget buffer of {} bytes", budget.bytes()),
            }
            .into());
        }
        self.budget = Some(budget);
        Ok(())
    }

    /// Per lane, whether its budget was above 0 after the newest step read (true for a
    /// lane reset since, and for every lane without [`TokenRing::track_budget`]).
    pub fn live(&self) -> &[bool] {
        &self.live
    }

    /// The token slots (retain in the step graph, or put in its pointer table).
    pub fn ring_buffer(&self) -> &Arc<DeviceBuffer> {
        &self.ring
    }

    /// The per-lane counts.
    pub fn emitted_buffer(&self) -> &Arc<DeviceBuffer> {
        &self.emitted
    }

    pub fn lanes(&self) -> usize {
        self.lanes
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues, after everything queued so far (the replay just issued), a copy of the ring
    /// and counts into a free mirror, and an event. If every mirror is pending, the oldest is
    /// read first (blocking until its copy is done).
    pub fn after_replay(&mut self) -> Result<(), RuntimeError> {
        if self.pending.len() == self.mirrors.len() {
            self.harvest_front(true)?;
        }
        let m = self.next;
        self.next = (self.next + 1) % self.mirrors.len();
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let split = self.lanes * self.capacity * 4;
        let (slots, counts) = self.mirrors[m].as_mut_slice().split_at_mut(split);
        let (counts, budgets) = counts.split_at_mut(self.lanes * 4);
        let budgets = &mut budgets[..self.lanes * 4];
        let s = self.stream.cu_stream();
        // SAFETY: the mirror is pinned and not pending, so nothing reads it or copies into it
        // until `events[m]`, recorded next, completes; the two destination ranges are exactly
        // the sizes of the device ranges read, which `from_states` checked fit the buffers.
        unsafe {
            result::memcpy_dtoh_async(slots, self.ring.ptr(), s)
                .during("copying the token ring to the host")?;
            result::memcpy_dtoh_async(counts, self.emitted.ptr(), s)
                .during("copying the emitted counts to the host")?;
            if let Some(b) = &self.budget {
                result::memcpy_dtoh_async(budgets, b.ptr(), s)
                    .during("copying the budgets to the host")?;
            }
        }
        self.events[m]
            .record(&self.stream)
            .during("recording the ring event")?;
        self.pending.push_back(m);
        Ok(())
    }

    /// Per lane, the tokens of steps whose copies have completed, without blocking.
    pub fn poll(&mut self) -> Result<Vec<Vec<i32>>, RuntimeError> {
        while !self.pending.is_empty() && self.harvest_front(false)? {}
        Ok(self.take_ready())
    }

    /// Per lane, the tokens of every step queued so far; blocks until their copies complete.
    pub fn wait(&mut self) -> Result<Vec<Vec<i32>>, RuntimeError> {
        self.drain()?;
        Ok(self.take_ready())
    }

    /// Per lane, the tokens of every queued step but the newest (which may still run;
    /// blocks until the others' copies complete), and how many steps the tokens span (those
    /// read earlier, e.g. by [`TokenRing::reset_lane`], included).
    pub fn wait_behind(&mut self) -> Result<(Vec<Vec<i32>>, usize), RuntimeError> {
        while self.pending.len() > 1 {
            self.harvest_front(true)?;
        }
        Ok(self.take_steps())
    }

    /// [`TokenRing::wait`], with how many steps the tokens span.
    pub fn wait_steps(&mut self) -> Result<(Vec<Vec<i32>>, usize), RuntimeError> {
        self.drain()?;
        Ok(self.take_steps())
    }

    fn take_steps(&mut self) -> (Vec<Vec<i32>>, usize) {
        let steps = self.harvested;
        (self.take_ready(), steps)
    }

    /// Restarts lane `lane` (a new sequence): waits for queued copies (the other lanes'
    /// tokens stay ready for the next read; the lane's own, of the sequence it ends, are
    /// dropped), then queues `emitted[lane] = 0` on the stream, ordered before the next
    /// replay.
    pub fn reset_lane(&mut self, lane: usize) -> Result<(), RuntimeError> {
        if lane >= self.lanes {
            return Err(CudaError::RingShape {
                lanes: self.lanes,
                capacity: self.capacity,
                reason: format!("no lane {lane}"),
            }
            .into());
        }
        self.drain()?;
        self.emitted.write((lane * 4) as u64, &0i32.to_le_bytes())?;
        self.read[lane] = 0;
        self.ready[lane].clear();
        self.live[lane] = true;
        Ok(())
    }

    fn drain(&mut self) -> Result<(), RuntimeError> {
        while !self.pending.is_empty() {
            self.harvest_front(true)?;
        }
        Ok(())
    }

    fn take_ready(&mut self) -> Vec<Vec<i32>> {
        self.harvested = 0;
        std::mem::replace(&mut self.ready, vec![Vec::new(); self.lanes])
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
        let (slots, counts) = words.split_at(self.lanes * self.capacity);
        let (counts, budgets) = counts.split_at(self.lanes);
        if self.budget.is_some() {
            for (l, &b) in self.live.iter_mut().zip(budgets) {
                *l = b > 0;
            }
        }
        self.harvested += 1;
        for lane in 0..self.lanes {
            let lane_slots = &slots[lane * self.capacity..(lane + 1) * self.capacity];
            let cursor = counts[lane] as u32;
            let new = take_new(lane, self.read[lane], cursor, lane_slots)?;
            self.read[lane] = cursor;
            self.ready[lane].extend_from_slice(&new);
        }
        Ok(true)
    }
}

fn decode_words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Tokens `read..cursor` of one lane from a snapshot of its slots.
fn take_new(lane: usize, read: u32, cursor: u32, slots: &[i32]) -> Result<Vec<i32>, CudaError> {
    let cap = slots.len() as u64;
    let unread = u64::from(cursor.wrapping_sub(read));
    if unread > cap {
        return Err(CudaError::RingOverflow {
            lane,
            unread,
            capacity: cap,
        });
    }
    Ok((0..unread)
        .map(|i| slots[((u64::from(read) + i) % cap) as usize])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_tokens_since_last_read_with_wraparound() {
        // Capacity 4; tokens 0..6 emitted, so slots hold tokens 4,5,2,3 (slot = e % 4).
        let slots = [4, 5, 2, 3];
        assert_eq!(take_new(0, 2, 6, &slots).unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(take_new(0, 6, 6, &slots).unwrap(), Vec::<i32>::new());
        assert!(matches!(
            take_new(3, 1, 6, &slots),
            Err(CudaError::RingOverflow {
                lane: 3,
                unread: 5,
                capacity: 4
            })
        ));
    }

    #[test]
    fn capacity_need_not_be_a_power_of_two() {
        // Capacity 3; tokens 0..5: slots hold 3,4,2.
        assert_eq!(take_new(0, 2, 5, &[3, 4, 2]).unwrap(), vec![2, 3, 4]);
    }

    #[test]
    fn decodes_little_endian_words() {
        let b: Vec<u8> = [7i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(decode_words(&b), vec![7, -1]);
    }
}
