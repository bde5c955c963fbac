//! NATS decentralised auth for tests (operator mode): an operator, accounts
//! signed by it and users signed by an account, as JWTs (v2, the format
//! nats-server 2.2+ reads), a creds file for a user, and a server
//! configuration that trusts the operator and preloads the accounts
//! (`resolver: MEMORY`).
//!
//! A JWT is `base64url(header).base64url(claims).base64url(signature)`
//! without padding, the header `{"typ":"JWT","alg":"ed25519-nkey"}`, the
//! signature the issuer's Ed25519 NKey over the first two parts. Limits are
//! written out as -1 (unlimited): a missing limit reads as 0 in the server.
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Signs `nats` (the claims' `nats` object) as a JWT about `subject`,
/// issued by `issuer`.
pub fn encode(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut claims = json!({
        "iat": iat,
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    // A unique id: the hash of the rest of the claims.
    let jti = hex::encode(Sha256::digest(claims.to_string().as_bytes()));
    claims["jti"] = Value::String(jti);
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string().as_bytes());
    let signed = format!("{header}.{body}");
    let signature = issuer
        .sign(signed.as_bytes())
        .expect("the issuer's key has a seed");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// The operator's own (self-signed) JWT.
pub fn operator_jwt(operator: &KeyPair, name: &str) -> String {
    encode(
        operator,
        &operator.public_key(),
        name,
        json!({"type": "operator", "version": 2}),
    )
}

/// An account's JWT, signed by the operator: no limits, no imports or
/// exports, JetStream off.
pub fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str) -> String {
    encode(
        operator,
        &account.public_key(),
        name,
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1,
                "imports": -1, "exports": -1, "wildcards": true,
                "conn": -1, "leaf": -1,
            },
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account",
            "version": 2,
        }),
    )
}

/// A user's JWT, signed by its account: may publish and subscribe to
/// anything, no limits.
pub fn user_jwt(account: &KeyPair, user: &KeyPair, name: &str) -> String {
    encode(
        account,
        &user.public_key(),
        name,
        json!({
            "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1,
            "type": "user",
            "version": 2,
        }),
    )
}

/// A creds file (as `nsc` writes them): the user's JWT and seed.
pub fn creds(user_jwt: &str, user: &KeyPair) -> String {
    let seed = user.seed().expect("the user's key has a seed");
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// A nats-server configuration in operator mode with a memory resolver
/// that knows these accounts (public key, JWT).
pub fn server_config(operator_jwt: &str, accounts: &[(String, String)]) -> String {
    let mut c = format!("operator: {operator_jwt}\nresolver: MEMORY\nresolver_preload: {{\n");
    for (key, jwt) in accounts {
        c.push_str(&format!("  {key}: {jwt}\n"));
    }
    c.push_str("}\n");
    c
}

/// An operator with one account and one user in it.
pub struct Operator {
    pub operator: KeyPair,
    pub account: KeyPair,
    pub user: KeyPair,
    pub operator_jwt: String,
    pub account_jwt: String,
    pub user_jwt: String,
}

impl Operator {
    pub fn new() -> Operator {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        Operator {
            operator_jwt: operator_jwt(&operator, "wasmwatch-test"),
            account_jwt: account_jwt(&operator, &account, "app"),
            user_jwt: user_jwt(&account, &user, "wasmwatch"),
            operator,
            account,
            user,
        }
    }

    /// The server configuration trusting this operator, with its account.
    pub fn server_config(&self) -> String {
        server_config(
            &self.operator_jwt,
            &[(self.account.public_key(), self.account_jwt.clone())],
        )
    }

    /// The creds file of this operator's user.
    pub fn creds(&self) -> String {
        creds(&self.user_jwt, &self.user)
    }
}

impl Default for Operator {
    fn default() -> Operator {
        Operator::new()
    }
}
