//! Where shared state lives. Only Redis for now: [`redis::RedisStore`].

pub mod redis;
