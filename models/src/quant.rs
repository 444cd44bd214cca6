//! Quantised weight formats: `quantization_config` of `config.json`, and the per-tensor
//! facts of the safetensors headers.
//!
//! Two schemes (REFERENCE.md, "Weight formats"):
//! - **fp8 block** (`quant_method: "fp8"`, DeepSeek-V3, Kimi-K2-Instruct): a Linear's
//!   `weight` is `float8_e4m3fn` with an f32 `weight_scale_inv` `[ceil(out/128),
//!   ceil(in/128)]`; `W = fp8 · scale_inv[o/128, i/128]` (edge blocks partial).
//! - **int4 pack-quantized** (`quant_method: "compressed-tensors"`, Kimi-K2-Thinking /
//!   K2.5 routed experts): `weight_packed` i32 `[out, in/8]` (nibble `i` of word `j` is
//!   column `8j + i` as `u = q + 8`), `weight_scale` bf16/f16/f32 `[out, in/group]`,
//!   `weight_shape` i32/i64 `[2]` = `[out, in]`; `W = (u − 8) · scale[o, i/group]`.
//!
//! The quantised Linears are found in the headers, not from the config's `ignore` list:
//! int4 ones are exactly those with a `weight_packed`, fp8 ones exactly those whose
//! `weight` is stored as fp8. Every such tensor is checked here, before anything is
//! lowered; the lowering then gives each quantised Linear its format as IR dtypes
//! (`int4g<group>` / `fp8e4m3` plus a scale operand), and the stored bytes are what the
//! engine keeps.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;
use serde_json::Value;
use specc_ir::{DType, FP8_BLOCK};

use crate::checkpoint::{dtype_name, Checkpoint};
use crate::error::ModelError;

/// Suffixes of a quantised Linear's tensors (after its stem, e.g.
/// `model.layers.3.mlp.experts.7.gate_proj`).
pub const PACKED: &str = ".weight_packed";
pub const SCALE: &str = ".weight_scale";
pub const SHAPE: &str = ".weight_shape";
pub const ZERO_POINT: &str = ".weight_zero_point";
pub const WEIGHT: &str = ".weight";
pub const SCALE_INV: &str = ".weight_scale_inv";

/// The checkpoint-wide scheme `quantization_config` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuantScheme {
    /// No `quantization_config`: every weight is bf16/f16/f32.
    #[default]
    None,
    /// `quant_method: "fp8"`, `fmt: "e4m3"`, `weight_block_size: [128, 128]`.
    Fp8Block,
    /// `quant_method: "compressed-tensors"`, `format: "pack-quantized"`, 4-bit symmetric
    /// int groups of `group` input columns.
    Int4Pack { group: u32 },
}

/// The storage format of one quantised Linear weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// `{stem}.weight` fp8e4m3 `[out, in]` + `{stem}.weight_scale_inv` f32.
    Fp8Block,
    /// `{stem}.weight_packed` (IR `int4g<group>` `[out, in]`) + `{stem}.weight_scale` of
    /// dtype `scale`.
    Int4 { group: u32, scale: DType },
}

impl WeightFormat {
    /// The IR dtype of the weight value.
    pub fn weight_dtype(self) -> DType {
        match self {
            WeightFormat::Fp8Block => DType::Fp8E4M3,
            WeightFormat::Int4 { group, .. } => DType::Int4Group { group },
        }
    }

    /// The IR dtype of the scale value.
    pub fn scale_dtype(self) -> DType {
        match self {
            WeightFormat::Fp8Block => DType::F32,
            WeightFormat::Int4 { scale, .. } => scale,
        }
    }

    /// Graph weight names `(weight, scale)` of the Linear `stem`.
    pub fn names(self, stem: &str) -> (String, String) {
        match self {
            WeightFormat::Fp8Block => (format!("{stem}{WEIGHT}"), format!("{stem}{SCALE_INV}")),
            WeightFormat::Int4 { .. } => (format!("{stem}{PACKED}"), format!("{stem}{SCALE}")),
        }
    }
}

/// What the lowering knows of quantisation: the scheme, and the format of every quantised
/// Linear by stem (full checkpoint names, prefix included). Empty `formats` means every
/// Linear is stored unquantised.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct QuantSpec {
    pub scheme: QuantScheme,
    pub formats: BTreeMap<String, WeightFormat>,
}

impl QuantSpec {
    /// The format of the Linear whose plain weight would be `weight_name`
    /// (`{stem}.weight`), if it is quantised, and its stem. A graph prefix (`draft/`: the
    /// part up to the last `/`, which checkpoint names do not hold) is kept in the stem but
    /// not looked up.
    pub fn format_of<'n>(&self, weight_name: &'n str) -> Option<(&'n str, WeightFormat)> {
        let stem = weight_name.strip_suffix(WEIGHT)?;
        let key = stem.rsplit_once('/').map_or(stem, |(_, k)| k);
        self.formats.get(key).map(|f| (stem, *f))
    }
}

/// Resolves `quantization_config` (`file` names config.json in errors; `at` is the dotted
/// path of the object, `quantization_config` or `text_config.quantization_config`).
pub fn resolve_scheme(file: &Path, at: &str, q: Option<&Value>) -> Result<QuantScheme, ModelError> {
    let Some(q) = q else {
        return Ok(QuantScheme::None);
    };
    if q.is_null() {
        return Ok(QuantScheme::None);
    }
    let field = |f: &str| format!("{at}.{f}");
    let err =
        |f: &str, expected: &str, found: &Value| ModelError::field(file, field(f), expected, found);
    let obj = q
        .as_object()
        .ok_or_else(|| ModelError::field(file, at, "an object", q))?;
    let method = obj.get("quant_method").unwrap_or(&Value::Null);
    match method.as_str() {
        Some("fp8") => fp8_scheme(obj, &err),
        Some("compressed-tensors") => int4_scheme(obj, &err),
        _ => Err(err(
            "quant_method",
            "\"fp8\" (block fp8) or \"compressed-tensors\" (int4 pack-quantized)",
            method,
        )),
    }
}

type FieldErr<'a> = dyn Fn(&str, &str, &Value) -> ModelError + 'a;

fn fp8_scheme(
    obj: &serde_json::Map<String, Value>,
    err: &FieldErr<'_>,
) -> Result<QuantScheme, ModelError> {
    if let Some(f) = obj.get("fmt").filter(|f| !f.is_null()) {
        if f.as_str() != Some("e4m3") {
            return Err(err("fmt", "\"e4m3\"", f));
        }
    }
    if let Some(a) = obj.get("activation_scheme").filter(|a| !a.is_null()) {
        if a.as_str() != Some("dynamic") {
            return Err(err(
                "activation_scheme",
                "\"dynamic\" (weights-only fp8; static activation scales are not supported)",
                a,
            ));
        }
    }
    let b = FP8_BLOCK;
    let block = obj.get("weight_block_size").unwrap_or(&Value::Null);
    let ok = block
        .as_array()
        .is_some_and(|v| v.len() == 2 && v.iter().all(|x| x.as_u64() == Some(b)));
    if !ok {
        return Err(err(
            "weight_block_size",
            &format!("[{b}, {b}] (the only fp8 block size supported)"),
            block,
        ));
    }
    Ok(QuantScheme::Fp8Block)
}

fn int4_scheme(
    obj: &serde_json::Map<String, Value>,
    err: &FieldErr<'_>,
) -> Result<QuantScheme, ModelError> {
    let pack = "\"pack-quantized\"";
    let format = obj.get("format").unwrap_or(&Value::Null);
    if format.as_str() != Some("pack-quantized") {
        return Err(err("format", pack, format));
    }
    let groups = obj.get("config_groups").unwrap_or(&Value::Null);
    let Some(groups) = groups.as_object().filter(|g| !g.is_empty()) else {
        return Err(err(
            "config_groups",
            "an object of quantisation groups",
            groups,
        ));
    };
    let mut size = None;
    for (name, g) in groups {
        let at = |f: &str| format!("config_groups.{name}.{f}");
        if let Some(f) = g.get("format").filter(|f| !f.is_null()) {
            if f.as_str() != Some("pack-quantized") {
                return Err(err(&at("format"), pack, f));
            }
        }
        for act in ["input_activations", "output_activations"] {
            if let Some(a) = g.get(act).filter(|a| !a.is_null()) {
                return Err(err(&at(act), "null (weight-only quantisation)", a));
            }
        }
        let w = g.get("weights").unwrap_or(&Value::Null);
        if !w.is_object() {
            return Err(err(&at("weights"), "an object", w));
        }
        let get = |f: &str| w.get(f).unwrap_or(&Value::Null);
        let at = |f: &str| format!("config_groups.{name}.weights.{f}");
        if get("num_bits").as_u64() != Some(4) {
            return Err(err(&at("num_bits"), "4", get("num_bits")));
        }
        if get("type").as_str() != Some("int") {
            return Err(err(&at("type"), "\"int\"", get("type")));
        }
        if get("symmetric").as_bool() != Some(true) {
            return Err(err(
                &at("symmetric"),
                "true (no zero point)",
                get("symmetric"),
            ));
        }
        if get("strategy").as_str() != Some("group") {
            return Err(err(&at("strategy"), "\"group\"", get("strategy")));
        }
        let gs = get("group_size");
        let Some(n) = gs
            .as_u64()
            .filter(|&n| n > 0 && n.is_multiple_of(8) && n <= u32::MAX as u64)
        else {
            return Err(err(&at("group_size"), "a positive multiple of 8", gs));
        };
        match size {
            Some(s) if s != n => {
                return Err(err(
                    &at("group_size"),
                    &format!("the group size of the other groups ({s})"),
                    gs,
                ))
            }
            _ => size = Some(n),
        }
    }
    Ok(QuantScheme::Int4Pack {
        group: size.expect("one group at least") as u32,
    })
}

/// Every quantised Linear of `ck` under `scheme`, each checked against its headers (and,
/// for int4, its `weight_shape` values). `config` names config.json when the headers
/// contradict the scheme.
pub fn scan(ck: &Checkpoint, scheme: QuantScheme, config: &Path) -> Result<QuantSpec, ModelError> {
    let mut formats = BTreeMap::new();
    let bad = |name: &str, expected: String, found: String| ModelError::Tensor {
        file: ck
            .tensor(name)
            .map_or(ck.root(), |e| ck.file_of(e))
            .to_path_buf(),
        tensor: name.to_string(),
        expected,
        found,
    };
    let header = |name: &str| {
        ck.tensor(name)
            .map(|e| format!("{:?} {}", e.shape, dtype_name(e.dtype)))
    };
    let no_scheme = |name: &str, what: &str| {
        ModelError::field(
            config,
            "quantization_config",
            format!("a quantisation scheme for {what} tensor \"{name}\""),
            "none",
        )
    };
    for (name, e) in ck.tensors() {
        if let Some(stem) = name.strip_suffix(PACKED) {
            let QuantScheme::Int4Pack { group } = scheme else {
                return Err(match scheme {
                    QuantScheme::None => no_scheme(name, "the int4"),
                    _ => bad(
                        name,
                        "no int4 tensors (quantization_config says fp8)".into(),
                        header(name).unwrap_or_default(),
                    ),
                });
            };
            let f = int4_linear(ck, stem, group, &bad, &header)?;
            formats.insert(stem.to_string(), f);
        } else if let Some(stem) = name.strip_suffix(SHAPE) {
            let p = format!("{stem}{PACKED}");
            if ck.tensor(&p).is_none() {
                return Err(bad(
                    name,
                    format!("to give the shape of an int4 tensor \"{p}\""),
                    "no such tensor".into(),
                ));
            }
        } else if let Some(stem) = name.strip_suffix(SCALE_INV) {
            let w = format!("{stem}{WEIGHT}");
            if ck.tensor(&w).is_none_or(|e| e.dtype != Dtype::F8_E4M3) {
                return Err(bad(
                    name,
                    format!("to scale an fp8 tensor \"{w}\""),
                    header(&w).unwrap_or_else(|| "no such tensor".into()),
                ));
            }
        } else if e.dtype == Dtype::F8_E4M3 {
            let Some(stem) = name.strip_suffix(WEIGHT) else {
                return Err(bad(
                    name,
                    "fp8 data only in Linear weights (`<stem>.weight`)".into(),
                    header(name).unwrap_or_default(),
                ));
            };
            if scheme != QuantScheme::Fp8Block {
                return Err(match scheme {
                    QuantScheme::None => no_scheme(name, "the fp8"),
                    _ => bad(
                        name,
                        "no fp8 tensors (quantization_config says int4)".into(),
                        header(name).unwrap_or_default(),
                    ),
                });
            }
            fp8_linear(ck, stem, e.shape.as_slice(), &bad, &header)?;
            formats.insert(stem.to_string(), WeightFormat::Fp8Block);
        }
    }
    Ok(QuantSpec { scheme, formats })
}

type BadFn<'a> = dyn Fn(&str, String, String) -> ModelError + 'a;
type HeaderFn<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn fp8_linear(
    ck: &Checkpoint,
    stem: &str,
    shape: &[usize],
    bad: &BadFn<'_>,
    header: &HeaderFn<'_>,
) -> Result<(), ModelError> {
    let w = format!("{stem}{WEIGHT}");
    let [out, inp] = *shape else {
        return Err(bad(
            &w,
            "a 2-D fp8 weight [out, in]".into(),
            header(&w).unwrap_or_default(),
        ));
    };
    let b = FP8_BLOCK as usize;
    let want = [out.div_ceil(b), inp.div_ceil(b)];
    let s = format!("{stem}{SCALE_INV}");
    let want_text =
        format!("f32 {want:?} (the fp8 block scale of {w} [{out}, {inp}], blocks of {b}×{b})");
    match ck.tensor(&s) {
        None => Err(bad(&s, want_text, "no such tensor".into())),
        Some(e) if e.dtype != Dtype::F32 || e.shape != want => {
            Err(bad(&s, want_text, header(&s).unwrap_or_default()))
        }
        Some(_) => Ok(()),
    }
}

fn int4_linear(
    ck: &Checkpoint,
    stem: &str,
    group: u32,
    bad: &BadFn<'_>,
    header: &HeaderFn<'_>,
) -> Result<WeightFormat, ModelError> {
    let p = format!("{stem}{PACKED}");
    let sh = format!("{stem}{SHAPE}");
    let sc = format!("{stem}{SCALE}");
    let zp = format!("{stem}{ZERO_POINT}");
    if ck.tensor(&zp).is_some() {
        return Err(bad(
            &zp,
            "no zero point (symmetric int4)".into(),
            header(&zp).unwrap_or_default(),
        ));
    }
    // weight_shape: [out, in] as i32 or i64.
    let (out, inp) = match ck.tensor(&sh) {
        Some(e) if matches!(e.dtype, Dtype::I32 | Dtype::I64) && e.shape == [2] => {
            let v = ck.load_f32(&sh)?;
            let v = v.as_i64().expect("integer tensor");
            if v.iter().any(|&d| d <= 0) {
                return Err(bad(&sh, "positive [out, in]".into(), format!("{v:?}")));
            }
            (v[0] as usize, v[1] as usize)
        }
        found => {
            return Err(bad(
                &sh,
                format!("i32 or i64 [2] (the unpacked shape of {p})"),
                found.map_or("no such tensor".into(), |_| header(&sh).unwrap_or_default()),
            ))
        }
    };
    if !inp.is_multiple_of(8) {
        return Err(bad(
            &sh,
            "in-features a multiple of 8 (8 nibbles per i32 word)".into(),
            format!("[{out}, {inp}]"),
        ));
    }
    let e = ck.tensor(&p).expect("scanned tensor");
    if e.dtype != Dtype::I32 || e.shape != [out, inp / 8] {
        return Err(bad(
            &p,
            format!(
                "i32 [{out}, {}] (weight_shape [{out}, {inp}], 8 nibbles per word)",
                inp / 8
            ),
            header(&p).unwrap_or_default(),
        ));
    }
    if !inp.is_multiple_of(group as usize) {
        return Err(bad(
            &p,
            format!("in-features divisible by the group size {group} (quantization_config)"),
            format!("{inp} in-features"),
        ));
    }
    let want = [out, inp / group as usize];
    let want_text = format!("bf16, f16 or f32 {want:?} (one scale per {group} columns of {p})");
    let scale = match ck.tensor(&sc) {
        None => {
            return Err(bad(
                &sc,
                want_text,
                "no such tensor (int4 weight without its scale)".into(),
            ))
        }
        Some(e) => match e.dtype {
            Dtype::BF16 | Dtype::F16 | Dtype::F32 if e.shape == want => {
                crate::checkpoint::ir_dtype(e.dtype).expect("float dtype")
            }
            _ => return Err(bad(&sc, want_text, header(&sc).unwrap_or_default())),
        },
    };
    Ok(WeightFormat::Int4 { group, scale })
}

/// The formats the published checkpoints of `spec`'s scheme give its Linears, for random
/// weights (no headers to read): int4 for the routed experts (Kimi-K2-Thinking / K2.5's
/// `ignore` list keeps everything else bf16), fp8 for every Linear but the router,
/// embedding and lm_head (DeepSeek-V3, Kimi-K2-Instruct).
pub fn published_formats(
    spec: &crate::config::ModelSpec,
) -> Result<BTreeMap<String, WeightFormat>, ModelError> {
    let mut plain = spec.clone();
    plain.quant.formats.clear();
    if spec.quant.scheme == QuantScheme::None {
        return Ok(BTreeMap::new());
    }
    let g = crate::lower::lower_dense(&plain)?;
    let mut formats = BTreeMap::new();
    for (_, name, ty) in g.weights() {
        let (Some(stem), [_, cols]) = (name.strip_suffix(WEIGHT), ty.shape.dims()) else {
            continue;
        };
        let cols = cols.as_static().unwrap_or(0);
        let f = match spec.quant.scheme {
            QuantScheme::Int4Pack { group } => (stem.contains(".mlp.experts.")
                && cols.is_multiple_of(group as u64))
            .then_some(WeightFormat::Int4 {
                group,
                scale: DType::BF16,
            }),
            QuantScheme::Fp8Block => (!stem.ends_with("mlp.gate")
                && !stem.ends_with("embed_tokens")
                && !stem.ends_with("lm_head"))
            .then_some(WeightFormat::Fp8Block),
            QuantScheme::None => None,
        };
        if let Some(f) = f {
            formats.insert(stem.to_string(), f);
        }
    }
    Ok(formats)
}

/// `int4` nibbles of `weight_packed` bytes (little-endian i32 words) as the signed values
/// `q = u − 8`, one per column, row-major `[out, in]`.
pub fn unpack_int4(bytes: &[u8]) -> Vec<i64> {
    let mut q = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        // Byte k of word j holds nibbles 2k (low) and 2k + 1 (high): columns 8j + 2k, +1.
        q.push((b & 0xf) as i64 - 8);
        q.push((b >> 4) as i64 - 8);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_unpack_least_significant_first() {
        // Word 0x76543210 + 0x88888888 per nibble: u = [8, 9, .., 15] -> q = [0, 1, .., 7].
        let word: u32 = 0xfedc_ba98;
        let q = unpack_int4(&word.to_le_bytes());
        assert_eq!(q, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        let q = unpack_int4(&0x0123_4567u32.to_le_bytes());
        assert_eq!(q, vec![-1, -2, -3, -4, -5, -6, -7, -8]);
    }

    fn scheme(text: &str) -> Result<QuantScheme, String> {
        let v: Value = serde_json::from_str(text).unwrap();
        resolve_scheme(Path::new("config.json"), "quantization_config", Some(&v))
            .map_err(|e| e.to_string())
    }

    const KIMI: &str = r#"{"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": true,
        "strategy": "group", "group_size": 32, "dynamic": false}}},
        "ignore": ["lm_head", "re:.*self_attn.*"], "quantization_status": "compressed"}"#;

    #[test]
    fn published_configs_resolve() {
        assert_eq!(scheme(KIMI), Ok(QuantScheme::Int4Pack { group: 32 }));
        let ds = r#"{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]}"#;
        assert_eq!(scheme(ds), Ok(QuantScheme::Fp8Block));
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (
                KIMI.replace("compressed-tensors", "awq"),
                "quantization_config.quant_method",
            ),
            (
                KIMI.replace("pack-quantized", "int-quantized"),
                "quantization_config.format",
            ),
            (
                KIMI.replace("\"num_bits\": 4", "\"num_bits\": 8"),
                "config_groups.group_0.weights.num_bits",
            ),
            (
                KIMI.replace("\"group_size\": 32", "\"group_size\": 12"),
                "weights.group_size",
            ),
            (
                KIMI.replace("\"symmetric\": true", "\"symmetric\": false"),
                "weights.symmetric",
            ),
            (
                KIMI.replace("\"input_activations\": null", "\"input_activations\": {}"),
                "group_0.input_activations",
            ),
            (
                r#"{"quant_method": "fp8", "weight_block_size": [64, 64]}"#.into(),
                "weight_block_size",
            ),
            (
                r#"{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}"#.into(),
                "quantization_config.fmt",
            ),
        ];
        for (text, field) in cases {
            let e = scheme(&text).unwrap_err();
            assert!(e.contains(field), "{e} (want {field})");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
