//! wasmwatch-bus against real brokers, started by the tests on loopback:
//! one RabbitMQ for the whole binary (it takes seconds to boot), a NATS
//! server per test. The binaries come from Debian's `rabbitmq-server` and
//! `nats-server` packages, which `tests/prepare` installs; without them the
//! tests fail and say so.
mod amqp;
mod common;
mod nats;
