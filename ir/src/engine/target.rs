//! What a build is for: the GPU architectures to compile cubins for and every device fact
//! that changes a kernel choice. Nothing else in specc holds a device constant.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A GPU architecture kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Arch {
    /// Hopper (H100/H200) with the arch-specific features (wgmma, setmaxnreg).
    #[serde(rename = "sm_90a")]
    Sm90a,
    /// Blackwell datacenter (B200).
    #[serde(rename = "sm_100a")]
    Sm100a,
    /// Blackwell workstation (RTX PRO 6000).
    #[serde(rename = "sm_120")]
    Sm120,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm90a, Arch::Sm100a, Arch::Sm120];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
            Arch::Sm120 => "sm_120",
        }
    }

    /// Shared memory (static + dynamic) one block may opt into: 227 KiB on H100/H200 and
    /// B200, 99 KiB on the sm_120 parts (CUDA programming guide, compute capabilities).
    pub fn max_smem_per_block(self) -> u32 {
        match self {
            Arch::Sm90a | Arch::Sm100a => 227 * 1024,
            Arch::Sm120 => 99 * 1024,
        }
    }

    /// SMs of the part a build for this arch alone aims its work splits at: H100 SXM / H200
    /// (132), B200 (148), RTX PRO 6000 Blackwell (188).
    pub fn reference_sms(self) -> u32 {
        match self {
            Arch::Sm90a => 132,
            Arch::Sm100a => 148,
            Arch::Sm120 => 188,
        }
    }

    /// Copy bandwidth (read + write) and dense bf16 tensor-core rate of the reference part,
    /// bytes/s and FLOP/s: the H200's as measured on the device (shared/GPU.md); B200 and
    /// RTX PRO 6000 from their data sheets (8 TB/s, 2.25 PFLOP/s; 1.79 TB/s, 0.5 PFLOP/s).
    pub fn reference_ceilings(self) -> (u64, u64) {
        match self {
            Arch::Sm90a => (4_260_000_000_000, 790_000_000_000_000),
            Arch::Sm100a => (8_000_000_000_000, 2_250_000_000_000_000),
            Arch::Sm120 => (1_790_000_000_000, 500_000_000_000_000),
        }
    }

    /// The arch whose cubins run on a device of compute capability `major.minor`.
    pub fn of_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (10, 0) => Some(Arch::Sm100a),
            (12, 0) => Some(Arch::Sm120),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An arch name specc does not compile for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU arch `{0}` (expected one of sm_90a, sm_100a, sm_120)")]
pub struct UnknownArch(pub String);

impl FromStr for Arch {
    type Err = UnknownArch;
    fn from_str(s: &str) -> Result<Arch, UnknownArch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArch(s.to_string()))
    }
}

/// The devices a build targets: cubins are compiled for every arch in `archs`, and every
/// kernel choice (tilings, work splits, shared-memory stages) is made from the facts, which
/// every targeted device must meet. A target without archs builds the graphs and their
/// contract only (what the CPU backend executes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub archs: Vec<Arch>,
    /// SMs the work-split heuristics fill (kernels are correct on any count).
    pub sms: u32,
    /// Shared memory (static + dynamic) one block may use, bytes.
    pub smem_per_block: u32,
    /// Roofline ceilings of reports (no choice depends on them): copy bandwidth (read +
    /// write) in bytes/s and dense bf16 FLOP/s.
    pub bytes_per_s: u64,
    pub flops_per_s: u64,
    /// What the facts describe, for reports (`H200`, `sm_90a reference part`, ...).
    pub device: String,
}

impl Target {
    /// Facts every one of `archs` meets: the least shared memory per block, and the SMs of
    /// the first arch's reference part.
    pub fn for_archs(archs: &[Arch]) -> Target {
        let smem = archs.iter().map(|a| a.max_smem_per_block()).min();
        let names: Vec<&str> = archs.iter().map(|a| a.name()).collect();
        let first = archs.first().copied().unwrap_or(Arch::Sm90a);
        let (bytes_per_s, flops_per_s) = first.reference_ceilings();
        Target {
            archs: archs.to_vec(),
            sms: first.reference_sms(),
            smem_per_block: smem.unwrap_or(first.max_smem_per_block()),
            bytes_per_s,
            flops_per_s,
            device: if archs.is_empty() {
                "no GPU".to_string()
            } else {
                format!("reference part of {}", names.join(", "))
            },
        }
    }

    /// The device the process runs on, as the driver reports it (ceilings of the arch's
    /// reference part).
    pub fn for_device(arch: Arch, sms: u32, smem_per_block: u32, name: &str) -> Target {
        Target {
            sms,
            smem_per_block,
            device: name.to_string(),
            ..Target::for_archs(&[arch])
        }
    }

    /// No GPU: graphs and contract only.
    pub fn cpu() -> Target {
        Target {
            archs: Vec::new(),
            ..Target::for_archs(&[])
        }
    }

    pub fn has_kernels(&self) -> bool {
        !self.archs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_the_least_every_arch_meets() {
        let t = Target::for_archs(&[Arch::Sm90a, Arch::Sm120]);
        assert_eq!(t.smem_per_block, 99 * 1024);
        assert_eq!(t.sms, 132);
        assert_eq!(Target::for_archs(&[Arch::Sm90a]).smem_per_block, 227 * 1024);
        assert_eq!("sm_100a".parse::<Arch>(), Ok(Arch::Sm100a));
        assert!("sm_80"
            .parse::<Arch>()
            .unwrap_err()
            .to_string()
            .contains("sm_80"));
        assert_eq!(Arch::of_capability(9, 0), Some(Arch::Sm90a));
        assert!(!Target::cpu().has_kernels());
    }
}
