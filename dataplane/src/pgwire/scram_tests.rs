//! SCRAM server tests: RFC 7677's test vector, postgres-protocol's client driving the
//! server, PostgreSQL's stored verifier format, and tampered messages.

use super::*;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

/// RFC 7677 section 3: user "user", password "pencil".
#[test]
fn rfc7677_vector() {
    let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("b64");
    let verifier = ScramVerifier::from_password(b"pencil", &salt, 4096);
    let mut server = ScramServer::new(verifier, b"");
    server.server_nonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".to_owned();
    let first = server
        .process_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
        .expect("first");
    assert_eq!(
        first,
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    );
    let fin = server
        .process_client_final(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        )
        .expect("final");
    assert_eq!(fin, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
}

fn run_client(password: &[u8], verifier: ScramVerifier) -> Result<(), ScramError> {
    let mut client = ScramSha256::new(password, ChannelBinding::unsupported());
    let mut server = ScramServer::new(verifier, &[7u8; 18]);
    let first = server.process_client_first(client.message())?;
    client.update(&first).expect("client accepts server-first");
    let fin = server.process_client_final(client.message())?;
    client
        .finish(&fin)
        .expect("client accepts the server signature");
    Ok(())
}

#[test]
fn postgres_protocol_client_round_trip() {
    let v = ScramVerifier::from_password(b"s3cret", b"0123456789abcdef", 4096);
    assert_eq!(run_client(b"s3cret", v.clone()), Ok(()));
    assert_eq!(run_client(b"wrong", v), Err(ScramError::BadProof));
}

#[test]
fn stored_verifier_format_matches_postgres_protocol() {
    // postgres-protocol computes the rolpassword a client would send in ALTER ROLE.
    let stored = postgres_protocol::password::scram_sha_256(b"hunter2");
    let parsed = ScramVerifier::parse(&stored).expect("parses");
    assert_eq!(parsed.compose_rolpassword(), stored);
    let derived = ScramVerifier::from_password(b"hunter2", &parsed.salt, parsed.iterations);
    assert_eq!(derived, parsed);
    assert_eq!(run_client(b"hunter2", parsed), Ok(()));
}

#[test]
fn bad_verifier_strings() {
    for s in [
        "md5abc",
        "SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA",
        "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
        "SCRAM-SHA-256$4096:!!$AAAA:AAAA",
        "SCRAM-SHA-256$4096",
    ] {
        assert_eq!(ScramVerifier::parse(s), None, "{s}");
    }
}

#[test]
fn refused_client_first() {
    let v = ScramVerifier::from_password(b"x", b"salt", 16);
    let first = |m: &[u8]| ScramServer::new(v.clone(), b"n").process_client_first(m);
    assert_eq!(
        first(b"p=tls-server-end-point,,n=,r=abc"),
        Err(ScramError::Unsupported)
    );
    assert_eq!(first(b"n,a=bob,n=,r=abc"), Err(ScramError::Unsupported));
    assert_eq!(first(b"n,,n=,r=abc,m=ext"), Err(ScramError::Unsupported));
    assert_eq!(first(b"n,,r=abc"), Err(ScramError::Malformed));
    assert!(first(b"y,,n=bob,r=a,ext=1").is_ok());
    assert_eq!(first(b"n,,n=,r="), Err(ScramError::Malformed));
    assert_eq!(first(b"x,,n=,r=abc"), Err(ScramError::Malformed));
    assert_eq!(first(b""), Err(ScramError::Malformed));
}

#[test]
fn tampered_client_final() {
    let v = ScramVerifier::from_password(b"pw", b"salt", 16);
    let mut client = ScramSha256::new(b"pw", ChannelBinding::unsupported());
    let mut server = ScramServer::new(v.clone(), b"nonce");
    let first = server
        .process_client_first(client.message())
        .expect("first");
    client.update(&first).expect("update");
    let good = client.message().to_vec();
    let swap = |from: &[u8], to: &[u8]| {
        let s = String::from_utf8(good.clone()).expect("ascii");
        s.replacen(
            std::str::from_utf8(from).expect("ascii"),
            std::str::from_utf8(to).expect("ascii"),
            1,
        )
        .into_bytes()
    };
    let replay = |msg: &[u8]| {
        let mut s = ScramServer::new(v.clone(), b"nonce");
        s.process_client_first(&{
            let c = ScramSha256::new(b"pw", ChannelBinding::unsupported());
            c.message().to_vec()
        })
        .expect("first");
        s.process_client_final(msg)
    };
    // another exchange's server nonce: the client-final nonce no longer matches
    assert_eq!(replay(&good), Err(ScramError::Mismatch));
    assert_eq!(
        server.process_client_final(&swap(b"c=biws", b"c=eSws")),
        Err(ScramError::Mismatch)
    );
    // a proof with one bit flipped
    let mut c2 = ScramSha256::new(b"pw", ChannelBinding::unsupported());
    let mut s2 = ScramServer::new(v.clone(), b"nonce");
    c2.update(&s2.process_client_first(c2.message()).expect("first"))
        .expect("update");
    let mut msg = c2.message().to_vec();
    let at = find_last(&msg, b",p=").expect("proof") + 3; // first digit of the proof
    msg[at] = if msg[at] == b'A' { b'B' } else { b'A' };
    assert_eq!(s2.process_client_final(&msg), Err(ScramError::BadProof));
    let mut again = ScramServer::new(v, b"nonce");
    assert_eq!(
        again.process_client_final(&good),
        Err(ScramError::OutOfOrder)
    );
}
