//! Shapes made of static dims and bucket dims.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::DType;

/// A dimension fixed per captured bucket rather than per model.
///
/// `B`: sequences in the batch bucket. `T`: tokens per sequence per step (1 for decode,
/// k+1 for chain verify, the prompt chunk for prefill). `Ctx`: KV-cache capacity per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BucketDim {
    B,
    T,
    Ctx,
}

impl BucketDim {
    pub const ALL: [BucketDim; 3] = [BucketDim::B, BucketDim::T, BucketDim::Ctx];
}

impl fmt::Display for BucketDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BucketDim::B => "B",
            BucketDim::T => "T",
            BucketDim::Ctx => "Ctx",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Static(u64),
    Bucket(BucketDim),
}

impl Dim {
    pub fn as_static(self) -> Option<u64> {
        match self {
            Dim::Static(n) => Some(n),
            Dim::Bucket(_) => None,
        }
    }

    /// The concrete size under `bind`; `None` when a bucket dim is unbound.
    pub fn resolve(self, bind: &Bindings) -> Option<u64> {
        match self {
            Dim::Static(n) => Some(n),
            Dim::Bucket(b) => bind.get(b),
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Self {
        Dim::Static(n)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Static(n as u64)
    }
}

impl From<BucketDim> for Dim {
    fn from(b: BucketDim) -> Self {
        Dim::Bucket(b)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Bucket(b) => write!(f, "{b}"),
        }
    }
}

impl FromStr for Dim {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "B" => Ok(Dim::Bucket(BucketDim::B)),
            "T" => Ok(Dim::Bucket(BucketDim::T)),
            "Ctx" => Ok(Dim::Bucket(BucketDim::Ctx)),
            _ => s
                .parse::<u64>()
                .map(Dim::Static)
                .map_err(|_| format!("bad dim `{s}`")),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn new(dims: impl IntoIterator<Item = Dim>) -> Self {
        Shape(dims.into_iter().collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }

    /// Shape with the last dim replaced.
    pub fn with_last(&self, d: Dim) -> Shape {
        let mut v = self.0.clone();
        if let Some(l) = v.last_mut() {
            *l = d;
        }
        Shape(v)
    }

    /// Shape without its last dim.
    pub fn drop_last(&self) -> Shape {
        let mut v = self.0.clone();
        v.pop();
        Shape(v)
    }

    /// Concrete dims under `bind`.
    pub fn resolve(&self, bind: &Bindings) -> Option<Vec<usize>> {
        self.0
            .iter()
            .map(|d| d.resolve(bind).map(|n| n as usize))
            .collect()
    }

    /// Product of the static dims, and the bucket dims in order.
    pub fn split_static(&self) -> (u64, Vec<BucketDim>) {
        let mut p = 1u64;
        let mut b = Vec::new();
        for d in &self.0 {
            match d {
                Dim::Static(n) => p *= n,
                Dim::Bucket(x) => b.push(*x),
            }
        }
        (p, b)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Type of an IR value: element type and shape. Printed `bf16[B,T,4096]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, dims: impl IntoIterator<Item = Dim>) -> Self {
        TensorType {
            dtype,
            shape: Shape::new(dims),
        }
    }

    /// Bytes under `bind`, or `None` when a bucket dim is unbound.
    pub fn bytes(&self, bind: &Bindings) -> Option<u64> {
        let dims = self.shape.resolve(bind)?;
        let numel: u64 = dims.iter().map(|&d| d as u64).product();
        Some(self.dtype.storage_bytes(numel))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Concrete sizes for the bucket dims of one captured bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings(BTreeMap<BucketDim, u64>);

impl Bindings {
    pub fn new(b: u64, t: u64, ctx: u64) -> Self {
        let mut m = BTreeMap::new();
        m.insert(BucketDim::B, b);
        m.insert(BucketDim::T, t);
        m.insert(BucketDim::Ctx, ctx);
        Bindings(m)
    }

    pub fn get(&self, d: BucketDim) -> Option<u64> {
        self.0.get(&d).copied()
    }

    pub fn set(&mut self, d: BucketDim, n: u64) {
        self.0.insert(d, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_display_and_resolve() {
        let t = TensorType::new(
            DType::BF16,
            [BucketDim::B.into(), BucketDim::T.into(), Dim::Static(64)],
        );
        assert_eq!(t.to_string(), "bf16[B,T,64]");
        let bind = Bindings::new(2, 3, 16);
        assert_eq!(t.shape.resolve(&bind), Some(vec![2, 3, 64]));
        assert_eq!(t.bytes(&bind), Some(2 * 3 * 64 * 2));
        assert_eq!(t.shape.resolve(&Bindings::default()), None);
    }

    #[test]
    fn dims_parse() {
        assert_eq!("Ctx".parse::<Dim>().unwrap(), Dim::Bucket(BucketDim::Ctx));
        assert_eq!("17".parse::<Dim>().unwrap(), Dim::Static(17));
        assert!("x".parse::<Dim>().is_err());
    }
}
