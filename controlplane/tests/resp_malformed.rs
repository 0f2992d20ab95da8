//! Bad input closes only the offending connection; everyone else keeps being served.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use pgline_testkit::lab;
use pgline_testkit::TestDb;
use redis::AsyncCommands;

/// Sends `bytes`, then reads until the server closes; returns what it answered.
fn send_and_drain(addr: std::net::SocketAddr, bytes: &[u8], half_close: bool) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_closes_only_that_connection() {
    let db = TestDb::create("malformed").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE t (id int4 PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'one');",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 2)).await;
    let addr = p.local_addr();
    let mut good = lab::redis(&p).await;
    let v: Option<String> = good.get("t:1").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"id":1,"v":"one"}"#));

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad array length", b"*abc\r\n".to_vec()),
        ("negative bulk length", b"*1\r\n$-5\r\n".to_vec()),
        (
            "1 GB bulk claim",
            b"*2\r\n$3\r\nGET\r\n$1000000000\r\n".to_vec(),
        ),
        ("huge array claim", b"*999999999\r\n".to_vec()),
        ("missing CRLF after bulk", b"*1\r\n$4\r\nPINGxx".to_vec()),
        (
            "binary garbage after *",
            std::iter::once(b'*')
                .chain((0..=255u8).cycle().take(4096))
                .collect(),
        ),
    ];
    for (name, bytes) in &cases {
        let (reply, closed) = tokio::task::spawn_blocking({
            let bytes = bytes.clone();
            move || send_and_drain(addr, &bytes, false)
        })
        .await
        .unwrap();
        assert!(closed, "{name}: connection not closed");
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.starts_with("-ERR") || text.contains("-ERR Protocol error"),
            "{name}: replied {text:?}"
        );
        // Everyone else is unaffected.
        let v: Option<String> = good.get("t:1").await.unwrap();
        assert!(v.is_some(), "{name}: good client broken");
    }

    // Garbage that reads as inline commands: errors, then closed at EOF; no panic.
    let (reply, closed) = tokio::task::spawn_blocking(move || {
        let bytes: Vec<u8> = (0..=255u8).rev().cycle().take(4096).collect();
        send_and_drain(addr, &bytes, true)
    })
    .await
    .unwrap();
    assert!(closed && String::from_utf8_lossy(&reply).starts_with("-ERR"));

    // Half a frame, then the client disconnects: nothing to answer, nothing leaks.
    let (reply, closed) = tokio::task::spawn_blocking(move || {
        send_and_drain(addr, b"*2\r\n$3\r\nGET\r\n$10\r\nt:", true)
    })
    .await
    .unwrap();
    assert!(
        closed && reply.is_empty(),
        "half frame: {:?}",
        String::from_utf8_lossy(&reply)
    );

    // A pipeline followed by a half-close is answered in full, in order.
    let (reply, closed) = tokio::task::spawn_blocking(move || {
        send_and_drain(addr, b"PING\r\nGET t:1\r\nGET t:2\r\nECHO hi\r\n", true)
    })
    .await
    .unwrap();
    assert!(closed);
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "+PONG\r\n$18\r\n{\"id\":1,\"v\":\"one\"}\r\n$-1\r\n$2\r\nhi\r\n"
    );

    let v: Option<String> = good.get("t:1").await.unwrap();
    assert!(v.is_some());
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut good)
        .await
        .unwrap();
    assert!(info.contains("protocol_errors:"), "{info}");
    p.shutdown().await;
}
