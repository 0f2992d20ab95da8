//! placeholder
pub mod keytext;
pub mod rowjson;
