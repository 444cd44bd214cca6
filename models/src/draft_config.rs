//! What every published draft format's `config.json` shares: reading it as raw JSON and
//! checking its `architectures` entry. Each format then resolves its own fields.

use std::path::Path;

use serde_json::Value;

use crate::error::ModelError;

/// `dir/config.json` as text, with the path errors should name.
pub fn read(dir: &Path) -> Result<(std::path::PathBuf, String), ModelError> {
    let file = dir.join("config.json");
    let text = crate::files::read_text(&file)?;
    Ok((file, text))
}

/// Parses `text` and checks that `architectures` lists `arch` (`what` names the format in
/// the error, e.g. "an EAGLE-3 head").
pub fn parse(file: &Path, text: &str, arch: &str, what: &str) -> Result<Value, ModelError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ModelError::json(file, &e))?;
    let archs: Vec<String> = v
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if !archs.iter().any(|a| a == arch) {
        return Err(ModelError::field(
            file,
            "architectures",
            format!("[\"{arch}\"] ({what})"),
            serde_json::to_string(&archs).unwrap_or_default(),
        ));
    }
    Ok(v)
}
