use thiserror::Error;

use crate::ValueId;

#[derive(Debug, Error, PartialEq)]
pub enum IrError {
    #[error("{node}: argument {arg} is not defined before it")]
    UnknownValue { node: ValueId, arg: ValueId },
    #[error("{node} = {op}: {msg}")]
    Type {
        node: ValueId,
        op: &'static str,
        msg: String,
    },
    #[error("{node}: {msg}")]
    Verify { node: ValueId, msg: String },
    #[error("graph output `{name}`: {msg}")]
    Output { name: String, msg: String },
    #[error("line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("interpreter: {0}")]
    Interp(String),
}
