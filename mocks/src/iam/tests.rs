//! The evaluator on the shipped policy and on small documents, without HTTP.

use super::*;
