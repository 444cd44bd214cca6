//! Raw JSON structs whose type errors name the field.
//!
//! serde's derived errors say "invalid type: string, expected u64 at line 3" without the
//! field. [`raw_struct!`] derives `Deserialize` (every field optional, unknown fields
//! ignored) and also [`RawField::diagnose`], which walks the JSON value field by field to
//! find the first one that does not fit its type, so errors read
//! `field "num_attention_heads": expected a positive integer, found -3`.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ModelError;

/// Where a JSON value fails to deserialize.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Dotted path from the value diagnosed down to the offending part (empty: the value).
    pub path: String,
    pub expected: &'static str,
    pub found: String,
}

impl Mismatch {
    pub fn here(expected: &'static str, found: &Value) -> Mismatch {
        Mismatch {
            path: String::new(),
            expected,
            found: found.to_string(),
        }
    }

    /// The same mismatch seen from the object holding `key`.
    pub fn under(self, key: &str) -> Mismatch {
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{key}.{}", self.path)
        };
        Mismatch { path, ..self }
    }
}

/// A type a raw struct field may have, with the phrase its errors use.
pub trait RawField: DeserializeOwned {
    /// What the JSON must look like, e.g. "a positive integer".
    const EXPECTED: &'static str;

    /// The first part of `v` that does not deserialize as `Self`, if any.
    fn diagnose(v: &Value) -> Option<Mismatch> {
        match serde_json::from_value::<Self>(v.clone()) {
            Ok(_) => None,
            Err(_) => Some(Mismatch::here(Self::EXPECTED, v)),
        }
    }
}

impl<T: RawField> RawField for Option<T> {
    const EXPECTED: &'static str = T::EXPECTED;
    fn diagnose(v: &Value) -> Option<Mismatch> {
        if v.is_null() {
            None
        } else {
            T::diagnose(v)
        }
    }
}

impl<T: RawField> RawField for Box<T> {
    const EXPECTED: &'static str = T::EXPECTED;
    fn diagnose(v: &Value) -> Option<Mismatch> {
        T::diagnose(v)
    }
}

impl RawField for f64 {
    const EXPECTED: &'static str = "a number";
}
impl RawField for bool {
    const EXPECTED: &'static str = "true or false";
}
impl RawField for String {
    const EXPECTED: &'static str = "a string";
}
impl RawField for Vec<String> {
    const EXPECTED: &'static str = "a list of strings";
}
impl RawField for Value {
    const EXPECTED: &'static str = "any JSON value";
}
impl RawField for std::collections::BTreeMap<String, String> {
    const EXPECTED: &'static str = "an object whose values are strings";
}

/// Deserializes `v` as `T`, turning a type error into a [`ModelError::Field`] naming the
/// offending field of `file`.
pub fn from_value<T: RawField>(file: &Path, v: Value) -> Result<T, ModelError> {
    let mismatch = match T::diagnose(&v) {
        Some(m) => m,
        None => match serde_json::from_value::<T>(v.clone()) {
            Ok(t) => return Ok(t),
            // diagnose and deserialize disagree: still report something useful.
            Err(e) => Mismatch {
                path: String::new(),
                expected: T::EXPECTED,
                found: e.to_string(),
            },
        },
    };
    let field = if mismatch.path.is_empty() {
        "(top level)".to_string()
    } else {
        mismatch.path
    };
    Err(ModelError::field(
        file,
        field,
        mismatch.expected,
        mismatch.found,
    ))
}

/// Defines a raw struct: `#[derive(Deserialize)]`, `#[serde(default)]`, every field public,
/// `name as "json key": Type` to rename, plus its [`RawField`] impl.
macro_rules! raw_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[doc = $doc:literal])* $field:ident $(as $json:literal)? : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
        #[serde(default)]
        $vis struct $name {
            $( $(#[doc = $doc])* $(#[serde(rename = $json)])? pub $field: $ty, )*
        }

        impl $crate::raw::RawField for $name {
            const EXPECTED: &'static str = "an object";
            fn diagnose(v: &serde_json::Value) -> Option<$crate::raw::Mismatch> {
                let Some(map) = v.as_object() else {
                    return Some($crate::raw::Mismatch::here(Self::EXPECTED, v));
                };
                $(
                    let key = raw_struct!(@key $field $(, $json)?);
                    if let Some(x) = map.get(key) {
                        if let Some(m) = <$ty as $crate::raw::RawField>::diagnose(x) {
                            return Some(m.under(key));
                        }
                    }
                )*
                None
            }
        }
    };
    (@key $field:ident) => { stringify!($field) };
    (@key $field:ident, $json:literal) => { $json };
}
