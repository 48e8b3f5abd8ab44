//! Layout checks shared by the ops' validation: tk-core's.

pub(crate) use tk_core::validate::{check_rank, check_unit_last_stride, check_vector};
