//! The quantised side of a checkpoint: finding and checking its quantised Linears
//! ([`crate::quant`]), and decoding stored values (fp8 bytes, int4 words) for the interpreter.

use std::path::Path;

use safetensors::Dtype;
use specc_ir::interp::Tensor;
use specc_ir::DType;

use super::{dtype_name, Checkpoint, TensorEntry};
use crate::error::ModelError;
use crate::quant::{self, WeightFormat};

impl Checkpoint {
    /// Finds and checks every quantised Linear against the headers under the scheme of
    /// `spec`'s `quantization_config` (`config` names config.json), and records their
    /// formats in `spec` (for the lowering; reading needs none: see [`Checkpoint::int4_dtype`]). The routed
    /// experts of each MoE projection must share one format.
    pub fn adapt_quant(
        &mut self,
        spec: &mut crate::config::ModelSpec,
        config: &Path,
    ) -> Result<(), ModelError> {
        let q = quant::scan(self, spec.quant.scheme, config)?;
        if let Some(moe) = &spec.moe {
            for l in moe.first_dense..spec.layers {
                for proj in ["gate_proj", "up_proj", "down_proj"] {
                    let stem = |j: usize| {
                        format!(
                            "{}model.layers.{l}.mlp.experts.{j}.{proj}",
                            spec.weight_prefix
                        )
                    };
                    let first = q.formats.get(&stem(0));
                    for j in 1..moe.experts {
                        let s = stem(j);
                        let this = q.formats.get(&s);
                        if this != first {
                            let how = |f: Option<&WeightFormat>| {
                                f.map_or("unquantised".to_string(), |f| {
                                    f.weight_dtype().to_string()
                                })
                            };
                            return Err(ModelError::Tensor {
                                file: self.root.clone(),
                                tensor: s,
                                expected: format!(
                                    "the storage format of expert 0 ({}): the experts of a layer are stacked",
                                    how(first)
                                ),
                                found: how(this),
                            });
                        }
                    }
                }
            }
        }
        spec.quant = q;
        Ok(())
    }

    /// The IR dtype (`int4g<group>`) of an int4 `weight_packed` tensor (i32 `[out, in/8]`),
    /// its group read off its `weight_scale` `[out, in/group]`; `None` for other tensors.
    pub fn int4_dtype(&self, name: &str) -> Result<Option<DType>, ModelError> {
        let Some(stem) = name.strip_suffix(quant::PACKED) else {
            return Ok(None);
        };
        let Some(e) = self.tensors.get(name).filter(|e| e.dtype == Dtype::I32) else {
            return Ok(None);
        };
        let scale = format!("{stem}{}", quant::SCALE);
        let inp = e.shape.last().copied().unwrap_or(0) * 8;
        let groups = self
            .tensors
            .get(&scale)
            .filter(|s| s.shape.len() == e.shape.len())
            .and_then(|s| s.shape.last().copied())
            .filter(|&g| g > 0 && inp.is_multiple_of(g));
        match groups {
            Some(g) => Ok(Some(DType::Int4Group {
                group: (inp / g) as u32,
            })),
            None => Err(ModelError::Tensor {
                file: self.root.clone(),
                expected: format!("the scale of {name} ([.., a divisor of {inp}])"),
                found: self
                    .tensors
                    .get(&scale)
                    .map_or("no such tensor".into(), |s| {
                        format!("{:?} {}", s.shape, dtype_name(s.dtype))
                    }),
                tensor: scale,
            }),
        }
    }

    /// The values of `bytes`, part or all of tensor `name` (`e`), as a tensor of `shape`
    /// (stored elements; an int4 `weight_packed` is unpacked to 8 columns per word).
    pub(super) fn decode(
        &self,
        name: &str,
        e: &TensorEntry,
        mut shape: Vec<usize>,
        bytes: &[u8],
    ) -> Result<Tensor, ModelError> {
        if let Some(dtype) = self.int4_dtype(name)? {
            if let Some(l) = shape.last_mut() {
                *l *= 8;
            }
            return Ok(Tensor::from_i64(dtype, shape, quant::unpack_int4(bytes)));
        }
        let (dtype, data): (DType, Vec<f32>) = match e.dtype {
            Dtype::F8_E4M3 => (
                DType::Fp8E4M3,
                bytes.iter().map(|&b| fp8e4m3_to_f32(b)).collect(),
            ),
            Dtype::F32 => (
                DType::F32,
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::BF16 => (
                DType::BF16,
                bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect(),
            ),
            Dtype::F16 => (
                DType::F16,
                bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect(),
            ),
            Dtype::I64 | Dtype::I32 => {
                let wide = e.dtype == Dtype::I64;
                let vals: Vec<i64> = if wide {
                    bytes
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().expect("8-byte chunk")))
                        .collect()
                } else {
                    bytes
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes(c.try_into().expect("4-byte chunk")) as i64)
                        .collect()
                };
                let dt = if wide { DType::I64 } else { DType::I32 };
                return Ok(Tensor::from_i64(dt, shape, vals));
            }
            other => {
                return Err(ModelError::Tensor {
                    file: self.file_of(e).to_path_buf(),
                    tensor: name.into(),
                    expected: "bf16, f16, f32, fp8e4m3, i32 or i64 data".into(),
                    found: format!("{:?} {}", e.shape, dtype_name(other)),
                })
            }
        };
        Ok(Tensor::from_f32(dtype, shape, data))
    }
}

/// The value of an `float8_e4m3fn` byte (sign, 4 exponent bits with bias 7, 3 mantissa
/// bits; subnormals at exponent 0; `S.1111.111` is NaN; no infinities).
pub fn fp8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as i32;
    let man = (b & 7) as f32;
    if exp == 0xf && b & 7 == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}
