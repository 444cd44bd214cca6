//! Whether a checkpoint holds exactly the model its config describes, beyond the shapes and
//! dtypes of the tensors the graph reads ([`Checkpoint::validate`]).
//!
//! Rules, each failure one error naming the file and the field or tensor:
//! 1. [`check_layers`], from the headers alone and before anything is lowered: the tensors
//!    `model.layers.{i}.*` are those of layers `0..num_hidden_layers` (then the
//!    `num_nextn_predict_layers` MTP layers), no more and no fewer. A config with fewer
//!    layers than the checkpoint would run a truncated model; the error names the field
//!    and the first tensor that disagrees.
//! 2. [`check_unused`], after lowering: every tensor is read by a graph or belongs to one
//!    of the [`IGNORABLE`] families, which are recorded for a one-line note
//!    ([`Checkpoint::note`]). Any other tensor is an error; one of a layer past the graph's
//!    layers (`layers.{i}.*` where the graph reads `layers.{j}.*`) names `num_hidden_layers`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use specc_ir::Graph;

use crate::checkpoint::Checkpoint;
use crate::config::ModelSpec;
use crate::error::ModelError;

/// The decoder layers of the dense lowering are named `{LAYER_STEM}{i}.…`.
pub const LAYER_STEM: &str = "model.layers.";

/// What reads a checkpoint, as far as its unused tensors are concerned.
pub struct Reader<'a> {
    /// The config.json describing the checkpoint (errors about layer counts name it).
    pub config: &'a Path,
    /// `tie_word_embeddings`: a stored `lm_head.weight` is unused.
    pub tied: bool,
    pub layers: usize,
    pub mtp_layers: usize,
    /// A draft head reading the target's embedding.
    pub draft_head: bool,
    /// Where the decoder layers' tensors are: [`LAYER_STEM`], under the spec's
    /// `weight_prefix` (Kimi-K2.5: `language_model.model.layers.`).
    pub layer_stem: String,
    /// A multimodal checkpoint whose text model alone is lowered (Kimi-K2.5): its vision
    /// tower and projector are unused.
    pub text_only: bool,
}

impl<'a> Reader<'a> {
    /// A dense model (target or standalone draft).
    pub fn model(spec: &ModelSpec, config: &'a Path) -> Reader<'a> {
        Reader {
            config,
            tied: spec.tie_embeddings,
            layers: spec.layers,
            mtp_layers: spec.mtp_layers,
            draft_head: false,
            layer_stem: format!("{}{LAYER_STEM}", spec.weight_prefix),
            text_only: !spec.weight_prefix.is_empty(),
        }
    }

    /// An EAGLE-3 or DFlash head.
    pub fn head(config: &'a Path) -> Reader<'a> {
        Reader {
            config,
            tied: false,
            layers: 0,
            mtp_layers: 0,
            draft_head: true,
            layer_stem: LAYER_STEM.into(),
            text_only: false,
        }
    }
}

/// A family of tensors that checkpoints carry and decoding never reads.
pub struct Family {
    /// How the note names it.
    pub name: &'static str,
    /// Why it is unused.
    pub why: &'static str,
    matches: fn(&str, &Reader) -> bool,
}

/// Every known-unused family, in the order notes list them.
pub const IGNORABLE: &[Family] = &[
    Family {
        name: "rotary_emb.inv_freq",
        why: "RoPE frequencies, recomputed from the config",
        matches: |n, _| n.ends_with("rotary_emb.inv_freq"),
    },
    Family {
        name: "lm_head.weight",
        why: "tie_word_embeddings: the embedding is the head",
        matches: |n, r| r.tied && n == "lm_head.weight",
    },
    Family {
        name: "MTP layers",
        why: "multi-token prediction, not used to decode",
        matches: |n, r| {
            let past = layer_of(n).is_some_and(|(stem, i, _)| {
                stem == r.layer_stem && (r.layers..r.layers + r.mtp_layers).contains(&i)
            });
            past || ["mtp.", "model.mtp.", "model.mtp_layers."]
                .iter()
                .any(|p| n.starts_with(p))
        },
    },
    Family {
        name: "vision tower and projector",
        why: "the text model alone is lowered",
        matches: |n, r| {
            r.text_only
                && ["vision_tower.", "mm_projector.", "multi_modal_projector."]
                    .iter()
                    .any(|p| n.starts_with(p))
        },
    },
    Family {
        name: "int4 weight_shape",
        why: "the unpacked shape of a weight_packed, checked against it at open",
        matches: |n, _| n.ends_with(crate::quant::SHAPE),
    },
    Family {
        name: "t2d",
        why: "EAGLE-3's target-to-draft vocabulary mask; d2t is read",
        matches: |n, r| r.draft_head && n == "t2d",
    },
    Family {
        name: "embed_tokens.weight",
        why: "a draft head's copy of the embedding; the target's is read",
        matches: |n, r| r.draft_head && n == "embed_tokens.weight",
    },
];

/// Tensors of one [`IGNORABLE`] family a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub family: &'static Family,
    pub count: usize,
}

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for Family {}
impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// `(stem, i, rest)` of a layer tensor `{stem}{i}.{rest}` whose stem ends in `layers.`.
fn layer_of(name: &str) -> Option<(&str, usize, &str)> {
    let at = if name.starts_with("layers.") {
        0
    } else {
        name.find(".layers.")? + 1
    };
    let stem_end = at + "layers.".len();
    let (index, rest) = name[stem_end..].split_once('.')?;
    Some((&name[..stem_end], index.parse().ok()?, rest))
}

/// Rule 1: the checkpoint's `model.layers.{i}` are exactly the config's layers (and MTP
/// layers). A checkpoint without any such tensor is left to the tensor checks.
pub fn check_layers(ck: &Checkpoint, spec: &ModelSpec, config: &Path) -> Result<(), ModelError> {
    let stem = format!("{}{LAYER_STEM}", spec.weight_prefix);
    let mut held: BTreeMap<usize, &str> = BTreeMap::new();
    for (name, _) in ck.tensors() {
        if let Some((s, i, _)) = layer_of(name) {
            if s == stem {
                held.entry(i).or_insert(name);
            }
        }
    }
    let Some((&last, _)) = held.last_key_value() else {
        return Ok(());
    };
    let mismatch = |file: &Path, holds: usize, what: String| {
        ModelError::field(
            config,
            "num_hidden_layers",
            format!("{holds} (the layers {} holds: {what})", file.display()),
            spec.layers,
        )
    };
    if let Some((_, &name)) = held.range(spec.layers + spec.mtp_layers..).next() {
        let file = ck.file_of(ck.tensor(name).expect("a held tensor"));
        let holds = (last + 1).saturating_sub(spec.mtp_layers);
        return Err(mismatch(file, holds, format!("it has tensor \"{name}\"")));
    }
    if last + 1 < spec.layers {
        return Err(mismatch(
            ck.root(),
            last + 1,
            format!("it has no tensor \"{stem}{}.*\"", last + 1),
        ));
    }
    Ok(())
}

/// The weight names of `graphs` that start with `prefix`, stripped of it.
pub fn reads<'g>(graphs: &[&'g Graph], prefix: &str) -> BTreeSet<&'g str> {
    graphs
        .iter()
        .flat_map(|g| g.weights())
        .filter_map(|(_, name, _)| name.strip_prefix(prefix))
        .collect()
}

/// Rule 2: every tensor of `ck` is in `read` or of an [`IGNORABLE`] family (recorded in
/// `ck` for [`Checkpoint::note`]).
pub fn check_unused(
    ck: &mut Checkpoint,
    read: &BTreeSet<&str>,
    reader: &Reader,
) -> Result<(), ModelError> {
    let mut ignored: Vec<Ignored> = Vec::new();
    for (name, entry) in ck.tensors() {
        if read.contains(name) {
            continue;
        }
        if let Some(family) = IGNORABLE.iter().find(|f| (f.matches)(name, reader)) {
            match ignored.iter_mut().find(|i| i.family == family) {
                Some(i) => i.count += 1,
                None => ignored.push(Ignored { family, count: 1 }),
            }
            continue;
        }
        let file = ck.file_of(entry).to_path_buf();
        if let Some((stem, _, rest)) = layer_of(name) {
            let read_layers: BTreeSet<usize> = read
                .iter()
                .filter_map(|r| layer_of(r).filter(|&(s, _, _)| s == stem))
                .map(|(_, i, _)| i)
                .collect();
            let same_kind = read
                .iter()
                .any(|r| layer_of(r).is_some_and(|(s, _, x)| s == stem && x == rest));
            if same_kind {
                return Err(ModelError::field(
                    reader.config,
                    "num_hidden_layers",
                    format!(
                        "as many layers as {} holds (it has tensor \"{name}\")",
                        file.display()
                    ),
                    read_layers.len(),
                ));
            }
        }
        return Err(ModelError::Tensor {
            file,
            tensor: name.to_string(),
            expected: "only tensors the model reads".into(),
            found: format!(
                "a tensor nothing reads (does {} describe this checkpoint?)",
                reader.config.display()
            ),
        });
    }
    ignored.sort_by_key(|i| IGNORABLE.iter().position(|f| f == i.family));
    ck.ignored = ignored;
    Ok(())
}

/// A bundle's draft checkpoint against every graph that reads it: shapes and dtypes, then
/// rule 2 (a standalone draft's layers were checked when its model opened).
pub fn check_draft(b: &mut crate::SpecBundle) -> Result<(), ModelError> {
    let graphs = [&b.step, &b.draft_prefill];
    for g in graphs {
        b.draft_checkpoint.validate_prefixed(g, b.prefix)?;
    }
    let reader = match &b.draft {
        crate::DraftSide::Model(m) => Reader::model(m.spec(), m.config_file()),
        crate::DraftSide::Eagle3(e) => Reader::head(&e.config_file),
        crate::DraftSide::DFlash(d) => Reader::head(&d.config_file),
    };
    check_unused(&mut b.draft_checkpoint, &reads(&graphs, b.prefix), &reader)
}

impl Checkpoint {
    /// One line saying which known-unused tensors were skipped, if any.
    pub fn note(&self) -> Option<String> {
        if self.ignored.is_empty() {
            return None;
        }
        let total: usize = self.ignored.iter().map(|i| i.count).sum();
        let parts: Vec<String> = self
            .ignored
            .iter()
            .map(|i| format!("{} × {} ({})", i.count, i.family.name, i.family.why))
            .collect();
        Some(format!(
            "{}: skipped {total} tensor{} nothing reads: {}",
            self.root().display(),
            if total == 1 { "" } else { "s" },
            parts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::layer_of;

    #[test]
    fn layer_names() {
        assert_eq!(
            layer_of("model.layers.12.mlp.up_proj.weight"),
            Some(("model.layers.", 12, "mlp.up_proj.weight"))
        );
        assert_eq!(
            layer_of("layers.0.input_layernorm.weight"),
            Some(("layers.", 0, "input_layernorm.weight"))
        );
        assert_eq!(layer_of("model.norm.weight"), None);
        assert_eq!(layer_of("midlayer.norm.weight"), None);
        assert_eq!(layer_of("model.layers.x.norm"), None);
    }
}
