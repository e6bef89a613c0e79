//! A model checker of leasehold's waiting protocol that runs the shipped Lua scripts.
//!
//! The model ([`model::LockModel`], a [`stateright`] model) has Redis as an in-memory keyspace
//! on a logical clock ([`redis`]), runs the plain or the fair lock's scripts as
//! `leasehold-core` builds them through Lua 5.1 ([`lua`], [`scripts`]), and drives clients
//! that follow the waiting engine's steps ([`model`]); [`properties`] lists what is checked.
//! `docs/model.md` describes the model, its assumptions and how to read a counterexample
//! ([`trace`]).
#![forbid(unsafe_code)]

pub mod check;
pub mod config;
pub mod lua;
pub mod model;
pub mod properties;
pub mod redis;
pub mod scripts;
pub mod state;
pub mod trace;

pub use config::{Config, Kind, Variant};
pub use model::LockModel;
