use super::*;

const PROXY: &str = "/ProxyService/Proxy";
const PERCENT: &str = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";

#[derive(Debug, Clone, PartialEq, Eq)]
struct F {
    ty: u8,
    flags: u8,
    id: u32,
    payload: Vec<u8>,
}

fn frame(ty: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    put_frame_header(&mut v, payload.len(), ty, flags, id);
    v.extend_from_slice(payload);
    v
}

fn parse(mut b: &[u8]) -> Vec<F> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
        out.push(F {
            ty: b[3],
            flags: b[4],
            id: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
            payload: b[9..9 + len].to_vec(),
        });
        b = &b[9 + len..];
    }
    out
}

fn fields(list: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in list {
        encode_field(&mut b, n.as_bytes(), v.as_bytes());
    }
    b
}

fn request_fields(authority: Option<&str>) -> Vec<u8> {
    let mut l = vec![(":method", "POST"), (":scheme", "http"), (":path", PROXY)];
    if let Some(a) = authority {
        l.push((":authority", a));
    }
    l.push(("content-type", "application/grpc"));
    l.push(("te", "trailers"));
    fields(&l)
}

type Conn = ServerConn<()>;

fn cfg() -> Config {
    Config {
        stream_window: 1 << 20,
        conn_window: 2 << 20,
        max_frame: 16_384,
        max_streams: 4,
        max_header_list: 8_192,
        keep_fields: false,
    }
}

/// Feeds `bytes` (in one piece); what stays unconsumed is returned.
fn feed(c: &mut Conn, bytes: &[u8]) -> Result<BytesMut, ConnError> {
    let mut b = BytesMut::from(bytes);
    c.recv(&mut b)?;
    Ok(b)
}

fn events(c: &mut Conn) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// A connection past the preface and the client's SETTINGS, output taken.
fn open() -> Conn {
    let mut c = Conn::new(cfg());
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    assert!(feed(&mut c, &start).unwrap().is_empty());
    c.take_output();
    c
}

fn request(c: &mut Conn, id: u32) {
    feed(c, &frame(HEADERS, END_HEADERS, id, &request_fields(None))).unwrap();
    match events(c).as_slice() {
        [Event::Request { stream, .. }] => assert_eq!(*stream, id),
        e => panic!("{e:?}"),
    }
}

/// Stream `id` answered (its head sent), the client's windows for it and
/// the connection opened 1,000,000 bytes past the default.
fn answer_with_room(c: &mut Conn, id: u32) {
    for w in [0, id] {
        feed(c, &frame(WINDOW_UPDATE, 0, w, &1_000_000u32.to_be_bytes())).unwrap();
    }
    c.send_head(id, &[], false).unwrap();
}

fn data_of(c: &mut Conn, id: u32) -> Vec<u8> {
    let mut v = Vec::new();
    while let Recv::Data(b) = c.take_data(id) {
        v.extend_from_slice(&b);
        c.consumed(id, b.len());
    }
    v
}

#[test]
fn starts_with_settings_and_the_connection_window() {
    let mut c = Conn::new(cfg());
    let f = parse(&c.take_output());
    assert_eq!(f[0].ty, SETTINGS);
    assert_eq!(f[0].flags, 0);
    let mut settings = std::collections::HashMap::new();
    for s in f[0].payload.chunks(6) {
        settings.insert(
            u16::from_be_bytes([s[0], s[1]]),
            u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
        );
    }
    assert_eq!(settings[&SETTINGS_INITIAL_WINDOW_SIZE], 1 << 20);
    assert_eq!(settings[&SETTINGS_MAX_FRAME_SIZE], 16_384);
    assert_eq!(settings[&SETTINGS_MAX_CONCURRENT_STREAMS], 4);
    assert_eq!(f[1].ty, WINDOW_UPDATE);
    assert_eq!(f[1].id, 0);
    let inc = u32::from_be_bytes(f[1].payload[..4].try_into().unwrap());
    assert_eq!(i64::from(inc), (2 << 20) - DEFAULT_WINDOW);
}

#[test]
fn acknowledges_settings_and_answers_pings() {
    let mut c = Conn::new(cfg());
    c.take_output();
    // The preface and SETTINGS arrive a byte at a time.
    let mut all = PREFACE.to_vec();
    all.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0x10, 0]));
    all.extend(frame(PING, 0, 0, b"12345678"));
    let mut buf = BytesMut::new();
    for b in all {
        buf.extend_from_slice(&[b]);
        c.recv(&mut buf).unwrap();
    }
    assert!(buf.is_empty());
    let f = parse(&c.take_output());
    assert_eq!((f[0].ty, f[0].flags), (SETTINGS, ACK));
    assert_eq!((f[1].ty, f[1].flags), (PING, ACK));
    assert_eq!(f[1].payload, b"12345678");
    // Our PING, and its answer.
    c.ping();
    let f = parse(&c.take_output());
    assert_eq!((f[0].ty, f[0].flags), (PING, 0));
    feed(&mut c, &frame(PING, ACK, 0, &f[0].payload)).unwrap();
    assert_eq!(events(&mut c), vec![Event::Pong]);
    // An answer to nothing is not a PONG.
    feed(&mut c, &frame(PING, ACK, 0, &f[0].payload)).unwrap();
    assert_eq!(events(&mut c), vec![]);
}

/// Go's bound (issue 39, finding 5): at most 100 settings per frame, none
/// repeated; a new initial window reaches the open streams once per frame.
#[test]
fn settings_frames_are_bounded_as_go_bounds_them() {
    let entry = |k: u16, v: u32| [k.to_be_bytes().to_vec(), v.to_be_bytes().to_vec()].concat();
    // 100 distinct settings (unknown ones are ignored): taken.
    let mut c = open();
    request(&mut c, 1);
    let hundred: Vec<u8> = (0..100u16).flat_map(|i| entry(0x100 + i, 7)).collect();
    feed(&mut c, &frame(SETTINGS, 0, 0, &hundred)).unwrap();
    // 101: the connection ends with PROTOCOL_ERROR.
    let mut c = open();
    let many: Vec<u8> = (0..101u16).flat_map(|i| entry(0x100 + i, 7)).collect();
    let e = feed(&mut c, &frame(SETTINGS, 0, 0, &many)).unwrap_err();
    assert_eq!(e.code, reason::PROTOCOL_ERROR);
    // A frame full of INITIAL_WINDOW_SIZE entries (the measured flood:
    // 43,690 of them in a 256 KiB frame; here as many as 16 KiB holds).
    let mut c = open();
    let flood: Vec<u8> = (0..2_730u32)
        .flat_map(|i| entry(SETTINGS_INITIAL_WINDOW_SIZE, 65_535 + (i & 1)))
        .collect();
    let e = feed(&mut c, &frame(SETTINGS, 0, 0, &flood)).unwrap_err();
    assert_eq!(e.code, reason::PROTOCOL_ERROR);
    // A repeated setting: PROTOCOL_ERROR too.
    let mut c = open();
    let twice = [
        entry(SETTINGS_INITIAL_WINDOW_SIZE, 1),
        entry(SETTINGS_INITIAL_WINDOW_SIZE, 2),
    ]
    .concat();
    let e = feed(&mut c, &frame(SETTINGS, 0, 0, &twice)).unwrap_err();
    assert_eq!(e.code, reason::PROTOCOL_ERROR);
}

#[test]
fn a_bad_preface_or_a_first_frame_other_than_settings_is_a_connection_error() {
    let mut c = Conn::new(cfg());
    c.take_output();
    let e = feed(&mut c, b"GET / HTTP/1.1\r\n\r\n").unwrap_err();
    assert_eq!(e.code, reason::PROTOCOL_ERROR);
    let f = parse(&c.take_output());
    assert_eq!(f.last().unwrap().ty, GOAWAY);
    assert!(c.error().is_some());

    let mut c = Conn::new(cfg());
    let mut b = PREFACE.to_vec();
    b.extend(frame(PING, 0, 0, b"12345678"));
    assert!(feed(&mut c, &b).is_err());
}

#[test]
fn any_authority_is_accepted_and_the_head_is_read() {
    for authority in [Some(PERCENT), Some("/tmp/x.sock"), Some(""), None] {
        let mut c = open();
        feed(
            &mut c,
            &frame(HEADERS, END_HEADERS, 1, &request_fields(authority)),
        )
        .unwrap();
        let e = events(&mut c);
        let Event::Request {
            stream,
            head,
            end_stream,
        } = &e[0]
        else {
            panic!("{e:?}");
        };
        assert_eq!((*stream, *end_stream), (1, false));
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, PROXY);
        assert_eq!(head.content_type.as_deref(), Some("application/grpc"));
        assert_eq!(head.authority.as_deref(), authority);
        assert!(c.take_output().is_empty(), "no RST for {authority:?}");
    }
}

/// With `keep_fields` (the agent listener) a request's metadata comes
/// with its head, repeated keys included and in order; without it, none.
#[test]
fn metadata_is_kept_only_when_asked_for() {
    let block = fields(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/agent.AgentService/Connect"),
        (":authority", "proxy:8091"),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.81.1"),
        ("te", "trailers"),
        ("agentid", "node1"),
        ("authorization", "Bearer a"),
        ("authorization", "Bearer b"),
    ]);
    for keep in [false, true] {
        let mut c = Conn::new(Config {
            keep_fields: keep,
            ..cfg()
        });
        let mut start = PREFACE.to_vec();
        start.extend(frame(SETTINGS, 0, 0, &[]));
        start.extend(frame(HEADERS, END_HEADERS, 1, &block));
        feed(&mut c, &start).unwrap();
        let head = match events(&mut c).as_slice() {
            [Event::Request { head, .. }] => head.clone(),
            e => panic!("{e:?}"),
        };
        assert_eq!(head.content_type.as_deref(), Some("application/grpc"));
        let got: Vec<(&str, &[u8])> = head
            .fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        let want: Vec<(&str, &[u8])> = if keep {
            vec![
                ("user-agent", b"grpc-go/1.81.1"),
                ("te", b"trailers"),
                ("agentid", b"node1"),
                ("authorization", b"Bearer a"),
                ("authorization", b"Bearer b"),
            ]
        } else {
            vec![]
        };
        assert_eq!(got, want);
    }
}

#[test]
fn huffman_and_the_dynamic_table_are_decoded_across_blocks() {
    let mut c = open();
    let mut enc = loona_hpack::Encoder::new();
    let head: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", PROXY.as_bytes()),
        (b":authority", PERCENT.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.60.1"),
    ];
    for id in [1, 3] {
        let block = enc.encode(head.iter().copied());
        feed(&mut c, &frame(HEADERS, END_HEADERS, id, &block)).unwrap();
        match events(&mut c).as_slice() {
            [Event::Request { head, .. }] => {
                assert_eq!(head.path, PROXY);
                assert_eq!(head.authority.as_deref(), Some(PERCENT));
            }
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn continuation_frames_padding_and_priority() {
    let mut c = open();
    let block = request_fields(Some("a"));
    let (a, b) = block.split_at(7);
    // HEADERS with padding and priority, the rest in a CONTINUATION.
    let mut p = vec![3u8];
    p.extend([0, 0, 0, 0, 16]);
    p.extend_from_slice(a);
    p.extend([0, 0, 0]);
    let mut bytes = frame(HEADERS, PADDED | PRIORITY_FLAG, 1, &p);
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    feed(&mut c, &bytes).unwrap();
    assert!(matches!(
        events(&mut c).as_slice(),
        [Event::Request { stream: 1, .. }]
    ));

    // Another frame inside a block is a connection error.
    let mut c = open();
    let mut bytes = frame(HEADERS, 0, 1, a);
    bytes.extend(frame(PING, 0, 0, b"12345678"));
    assert_eq!(
        feed(&mut c, &bytes).unwrap_err().code,
        reason::PROTOCOL_ERROR
    );
    // So is a CONTINUATION out of a block.
    let mut c = open();
    assert!(feed(&mut c, &frame(CONTINUATION, END_HEADERS, 1, b)).is_err());
}

#[test]
fn an_endless_header_block_is_refused_before_it_grows_past_the_limit() {
    let mut c = open();
    feed(&mut c, &frame(HEADERS, 0, 1, &[0; 100])).unwrap();
    let mut err = None;
    for _ in 0..100 {
        if let Err(e) = feed(&mut c, &frame(CONTINUATION, 0, 1, &[0; 1000])) {
            err = Some(e);
            break;
        }
        assert!(c.buffered_capacity() <= 2 * 8_192 + 4_096);
    }
    assert_eq!(err.unwrap().code, reason::ENHANCE_YOUR_CALM);
}

#[test]
fn malformed_requests_are_reset_and_the_connection_lives_on() {
    let cases: [&[(&str, &str)]; 4] = [
        &[(":method", "POST"), (":path", PROXY)],
        &[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PROXY),
            ("Content-Type", "application/grpc"),
        ],
        &[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PROXY),
            ("connection", "close"),
        ],
        &[
            (":method", "POST"),
            ("x", "y"),
            (":scheme", "http"),
            (":path", PROXY),
        ],
    ];
    let mut c = open();
    let mut id = 1;
    for f in cases {
        feed(&mut c, &frame(HEADERS, END_HEADERS, id, &fields(f))).unwrap();
        assert_eq!(events(&mut c), vec![]);
        let out = parse(&c.take_output());
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].ty, out[0].id), (RST_STREAM, id));
        assert_eq!(out[0].payload, reason::PROTOCOL_ERROR.to_be_bytes());
        id += 2;
    }
    request(&mut c, id);
}

#[test]
fn data_arrives_as_it_comes_without_waiting_for_whole_frames() {
    let mut c = open();
    request(&mut c, 1);
    let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let bytes = frame(DATA, END_STREAM, 1, &payload);
    // Half the frame: the half of the payload there is passed on.
    let mut buf = BytesMut::from(&bytes[..5_000]);
    c.recv(&mut buf).unwrap();
    assert!(buf.is_empty());
    assert_eq!(events(&mut c), vec![Event::Wake(1)]);
    let got = data_of(&mut c, 1);
    assert_eq!(got, payload[..5_000 - 9]);
    assert_eq!(c.take_data(1), Recv::Pending);
    buf.extend_from_slice(&bytes[5_000..]);
    c.recv(&mut buf).unwrap();
    let mut got2 = data_of(&mut c, 1);
    assert_eq!(c.take_data(1), Recv::End);
    let mut all = got;
    all.append(&mut got2);
    assert_eq!(all, payload);
}

#[test]
fn padded_data_loses_its_padding_and_gives_it_back() {
    let mut c = open();
    request(&mut c, 1);
    let mut p = vec![4u8];
    p.extend_from_slice(b"hello");
    p.extend([0; 4]);
    let bytes = frame(DATA, PADDED | END_STREAM, 1, &p);
    let mut buf = BytesMut::new();
    for b in bytes {
        buf.extend_from_slice(&[b]);
        c.recv(&mut buf).unwrap();
    }
    assert_eq!(data_of(&mut c, 1), b"hello");
    assert_eq!(c.take_data(1), Recv::End);
    // A padding length past the frame is a connection error.
    let mut c = open();
    request(&mut c, 1);
    assert!(feed(&mut c, &frame(DATA, PADDED, 1, &[9, 1, 2])).is_err());
}

#[test]
fn taking_data_gives_window_back_once_a_quarter_is_owed() {
    let mut c = open();
    request(&mut c, 1);
    let chunk = vec![7u8; 16_384];
    let mut sent = 0;
    // A quarter of the stream window (256 KiB) arrives and is taken (the
    // connection's 2 MiB owes nothing yet).
    while sent < (1 << 20) / 4 {
        feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap();
        sent += chunk.len();
        assert_eq!(data_of(&mut c, 1).len(), chunk.len());
    }
    let f = parse(&c.take_output());
    let updates: Vec<_> = f.iter().filter(|f| f.ty == WINDOW_UPDATE).collect();
    assert_eq!(updates.len(), 1, "{f:?}");
    assert_eq!(updates[0].id, 1);
    assert_eq!(updates[0].payload, (sent as u32).to_be_bytes());
    // Data not taken is not given back: past the stream's window the
    // stream is reset, the connection lives.
    let mut c = open();
    request(&mut c, 1);
    request(&mut c, 3);
    for _ in 0..64 {
        feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap();
    }
    assert!(c.take_output().is_empty());
    feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap();
    let f = parse(&c.take_output());
    let rst = f.iter().find(|f| f.ty == RST_STREAM).expect("RST_STREAM");
    assert_eq!(rst.id, 1);
    assert_eq!(rst.payload, reason::FLOW_CONTROL_ERROR.to_be_bytes());
    assert_eq!(c.take_data(1), Recv::Reset(reason::FLOW_CONTROL_ERROR));
    // The stream's unread megabyte went back to the connection window.
    let update = f
        .iter()
        .find(|f| f.ty == WINDOW_UPDATE)
        .expect("WINDOW_UPDATE");
    assert_eq!(update.id, 0);
    assert_eq!(update.payload, (65u32 * 16_384).to_be_bytes());
    for _ in 0..64 {
        feed(&mut c, &frame(DATA, 0, 3, &chunk)).unwrap();
    }
    assert!(c.error().is_none());
}

#[test]
fn data_past_the_connection_window_is_a_connection_error() {
    let mut c = Conn::new(Config {
        stream_window: 1 << 20,
        conn_window: 65_535,
        ..cfg()
    });
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    feed(&mut c, &start).unwrap();
    request(&mut c, 1);
    let chunk = vec![0u8; 16_384];
    for _ in 0..3 {
        feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap();
    }
    let e = feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap_err();
    assert_eq!(e.code, reason::FLOW_CONTROL_ERROR);
}

fn response_frames(c: &mut Conn) -> Vec<F> {
    parse(&c.take_output())
}

fn decode(d: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Vec<(String, String)> {
    d.decode(block)
        .unwrap()
        .into_iter()
        .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

#[test]
fn a_response_waits_for_the_clients_windows_and_ends_with_trailers() {
    let mut c = open();
    request(&mut c, 1);
    c.send_head(1, &[("content-type", "application/grpc")], false)
        .unwrap();
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    c.send_data(1, Bytes::from(body[..60].to_vec())).unwrap();
    c.send_data(1, Bytes::from(body[60..].to_vec())).unwrap();
    c.send_trailers(1, &[("grpc-status", "0")]).unwrap();
    // The default window: 65,535 bytes go, in frames of 16 KiB at most.
    let f = response_frames(&mut c);
    let mut d = loona_hpack::Decoder::new();
    assert_eq!((f[0].ty, f[0].flags), (HEADERS, END_HEADERS));
    assert_eq!(
        decode(&mut d, &f[0].payload),
        vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/grpc".into())
        ]
    );
    let data: Vec<_> = f[1..].iter().filter(|f| f.ty == DATA).collect();
    assert!(data.iter().all(|f| f.payload.len() <= 16_384));
    let sent: Vec<u8> = data.iter().flat_map(|f| f.payload.clone()).collect();
    assert_eq!(sent.len(), 65_535);
    assert_eq!(c.send_pending(1).unwrap(), 100_000 - 65_535);
    // Window from the stream alone is not enough: the connection's too.
    feed(
        &mut c,
        &frame(WINDOW_UPDATE, 0, 1, &100_000u32.to_be_bytes()),
    )
    .unwrap();
    assert!(response_frames(&mut c).is_empty());
    feed(
        &mut c,
        &frame(WINDOW_UPDATE, 0, 0, &100_000u32.to_be_bytes()),
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![Event::Wake(1)]);
    let f = response_frames(&mut c);
    let rest: Vec<u8> = f
        .iter()
        .filter(|f| f.ty == DATA)
        .flat_map(|f| f.payload.clone())
        .collect();
    let mut all = sent;
    all.extend(rest);
    assert_eq!(all, body);
    let last = f.last().unwrap();
    assert_eq!((last.ty, last.flags), (HEADERS, END_HEADERS | END_STREAM));
    assert_eq!(
        decode(&mut d, &last.payload),
        vec![("grpc-status".into(), "0".into())]
    );
    assert_eq!(c.send_pending(1).unwrap(), 0);
}

#[test]
fn a_larger_initial_window_from_the_client_lets_more_out() {
    let mut c = open();
    request(&mut c, 1);
    c.send_head(1, &[], false).unwrap();
    c.send_data(1, Bytes::from(vec![1u8; 70_000])).unwrap();
    let f = response_frames(&mut c);
    let n: usize = f
        .iter()
        .filter(|f| f.ty == DATA)
        .map(|f| f.payload.len())
        .sum();
    assert_eq!(n, 65_535);
    // SETTINGS: a larger initial window (the connection's grows too).
    let mut s = vec![0, 4];
    s.extend(200_000u32.to_be_bytes());
    let mut bytes = frame(SETTINGS, 0, 0, &s);
    bytes.extend(frame(WINDOW_UPDATE, 0, 0, &100_000u32.to_be_bytes()));
    feed(&mut c, &bytes).unwrap();
    let f = response_frames(&mut c);
    assert_eq!((f[0].ty, f[0].flags), (SETTINGS, ACK));
    let n: usize = f
        .iter()
        .filter(|f| f.ty == DATA)
        .map(|f| f.payload.len())
        .sum();
    assert_eq!(n, 70_000 - 65_535);
    // A larger MAX_FRAME_SIZE makes larger frames.
    let mut s = vec![0, 5];
    s.extend(100_000u32.to_be_bytes());
    feed(&mut c, &frame(SETTINGS, 0, 0, &s)).unwrap();
    c.take_output();
    c.send_data(1, Bytes::from(vec![1u8; 40_000])).unwrap();
    let f = response_frames(&mut c);
    assert_eq!(f.iter().filter(|f| f.ty == DATA).count(), 1);
    // Out-of-range settings are connection errors.
    let mut s = vec![0, 5];
    s.extend(100u32.to_be_bytes());
    assert!(feed(&mut c, &frame(SETTINGS, 0, 0, &s)).is_err());
}

#[test]
fn output_stops_growing_past_the_high_mark_until_written() {
    let mut c = open();
    request(&mut c, 1);
    answer_with_room(&mut c, 1);
    c.send_data(1, Bytes::from(vec![1u8; 500_000])).unwrap();
    assert!(c.output_len() < OUT_HIGH + 16_384 + 64);
    assert!(c.send_pending(1).unwrap() > 0);
    events(&mut c);
    let mut total = 0;
    while c.output_len() > 0 {
        let n = c.output_len().min(10_000);
        total += n;
        c.wrote(n);
    }
    assert_eq!(c.send_pending(1).unwrap(), 0);
    assert_eq!(events(&mut c), vec![Event::Wake(1)]);
    assert!(total > 500_000);
}

#[test]
fn a_reset_from_the_client_reaches_both_halves() {
    let mut c = open();
    request(&mut c, 1);
    c.send_head(1, &[], false).unwrap();
    feed(&mut c, &frame(DATA, 0, 1, b"unread")).unwrap();
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 1, &reason::CANCEL.to_be_bytes()),
    )
    .unwrap();
    assert!(events(&mut c).contains(&Event::Wake(1)));
    assert_eq!(c.take_data(1), Recv::Reset(reason::CANCEL));
    assert_eq!(
        c.send_data(1, Bytes::from_static(b"x")),
        Err(SendError::Reset(reason::CANCEL))
    );
    assert_eq!(c.reset_reason(1), Some(reason::CANCEL));
    c.release(1);
    // No RST of our own for a stream the client reset.
    assert!(!response_frames(&mut c).iter().any(|f| f.ty == RST_STREAM));
    assert_eq!(c.stream_count(), 0);
    // DATA after the client's own RST_STREAM is a stream error
    // (STREAM_CLOSED), not a connection error.
    feed(&mut c, &frame(DATA, 0, 1, b"late")).unwrap();
    assert!(c.error().is_none());
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::STREAM_CLOSED)]
    );
    // RST_STREAM on a stream never opened is a connection error.
    assert!(feed(&mut c, &frame(RST_STREAM, 0, 9, &[0, 0, 0, 8])).is_err());
}

#[test]
fn releasing_a_stream_ends_it_at_the_client() {
    let mut c = open();
    request(&mut c, 1);
    request(&mut c, 3);
    c.send_head(1, &[], false).unwrap();
    c.release(1);
    c.send_head(3, &[("grpc-status", "12")], true).unwrap();
    c.release(3);
    // 1's response had not ended: CANCEL. 3's had, while its request goes
    // on: no RST_STREAM; it stays known until the client ends its side
    // (grpc-go answers our END_STREAM with RST_STREAM NO_ERROR).
    let f = response_frames(&mut c);
    assert_eq!(resets(&f), vec![(1, reason::CANCEL)]);
    assert_eq!(c.stream_count(), 1);
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 3, &reason::NO_ERROR.to_be_bytes()),
    )
    .unwrap();
    assert_eq!(c.stream_count(), 0);
    assert!(response_frames(&mut c).is_empty());
}

/// Streams kept after their response (see `release`) are bounded by
/// `max_streams`: past that the oldest is told to stop and forgotten.
#[test]
fn answered_streams_kept_for_the_client_are_bounded() {
    let mut c = open();
    let mut sent = Vec::new();
    for id in [1, 3, 5, 7, 9] {
        request(&mut c, id);
        c.send_head(id, &[("grpc-status", "0")], true).unwrap();
        c.release(id);
        // The client reads each answer (an end unwritten still counts).
        sent.extend(resets(&response_frames(&mut c)));
    }
    assert_eq!(c.stream_count(), 4);
    assert_eq!(sent, vec![(1, reason::NO_ERROR)]);
    // What was in flight on 1 is ignored.
    feed(&mut c, &frame(DATA, END_STREAM, 1, b"x")).unwrap();
    assert!(response_frames(&mut c).is_empty());
}

/// A caller that queues its last message and the trailers, then lets the
/// stream go (the gRPC frontend's task ends after `finish_with_status`),
/// has its answer delivered once the client's window lets it out, as the h2
/// crate delivers what a dropped `SendStream` queued; it was reset
/// (CANCEL) with the message and the status lost (found by
/// tests/h2_differential.rs: answers to a client slow to read).
#[test]
fn an_answer_released_before_it_is_written_is_delivered() {
    for request_ended_first in [false, true] {
        let mut c = open();
        if request_ended_first {
            request_ended(&mut c, 1);
        } else {
            request(&mut c, 1);
        }
        c.send_head(1, &[], false).unwrap();
        c.send_data(1, Bytes::from(vec![7u8; 100_000])).unwrap();
        c.send_trailers(1, &[("grpc-status", "0")]).unwrap();
        c.release(1);
        let f = response_frames(&mut c);
        assert!(resets(&f).is_empty(), "{:?}", resets(&f));
        let sent: usize = f
            .iter()
            .filter(|f| f.ty == DATA)
            .map(|f| f.payload.len())
            .sum();
        assert_eq!(sent, 65_535, "the default window");
        // Still counted against the limit: its end is not out.
        assert_eq!(c.stream_count(), 1);
        for w in [0, 1] {
            feed(
                &mut c,
                &frame(WINDOW_UPDATE, 0, w, &1_000_000u32.to_be_bytes()),
            )
            .unwrap();
        }
        let f = response_frames(&mut c);
        let rest: usize = f
            .iter()
            .filter(|f| f.ty == DATA)
            .map(|f| f.payload.len())
            .sum();
        assert_eq!(rest, 100_000 - 65_535);
        let last = f.last().unwrap();
        assert_eq!((last.ty, last.flags & END_STREAM), (HEADERS, END_STREAM));
        assert!(resets(&f).is_empty());
        if !request_ended_first {
            // The request goes on: checked until it ends, as any answered
            // stream released early.
            assert_eq!(c.stream_count(), 1);
            feed(&mut c, &frame(DATA, END_STREAM, 1, b"x")).unwrap();
            assert!(response_frames(&mut c).is_empty());
        }
        assert_eq!(c.stream_count(), 0);
        events(&mut c);
        assert_eq!(c.buffered_capacity(), 0);
    }
    // A client reset meanwhile ends it, and its queued answer with it.
    let mut c = open();
    request(&mut c, 1);
    c.send_head(1, &[], false).unwrap();
    c.send_data(1, Bytes::from(vec![7u8; 100_000])).unwrap();
    c.send_trailers(1, &[("grpc-status", "0")]).unwrap();
    c.release(1);
    response_frames(&mut c);
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 1, &reason::CANCEL.to_be_bytes()),
    )
    .unwrap();
    feed(
        &mut c,
        &frame(WINDOW_UPDATE, 0, 0, &1_000_000u32.to_be_bytes()),
    )
    .unwrap();
    assert!(response_frames(&mut c).is_empty());
    assert_eq!(c.stream_count(), 0);
}

#[test]
fn streams_past_the_limit_or_after_goaway_are_refused() {
    let mut c = open();
    for id in [1, 3, 5, 7] {
        request(&mut c, id);
    }
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 9, &request_fields(None)),
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![]);
    let f = response_frames(&mut c);
    assert_eq!((f[0].ty, f[0].id), (RST_STREAM, 9));
    assert_eq!(f[0].payload, reason::REFUSED_STREAM.to_be_bytes());
    c.release(1);
    // Its RST_STREAM is written: the client no longer counts it either.
    assert_eq!(resets(&response_frames(&mut c)), vec![(1, reason::CANCEL)]);
    request(&mut c, 11);
    c.go_away();
    let f = response_frames(&mut c);
    let g = f.iter().find(|f| f.ty == GOAWAY).unwrap();
    assert_eq!(g.payload[..4], 11u32.to_be_bytes());
    assert_eq!(g.payload[4..], reason::NO_ERROR.to_be_bytes());
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 13, &request_fields(None)),
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![]);
    // Streams open before the GOAWAY go on.
    feed(&mut c, &frame(DATA, 0, 11, b"still")).unwrap();
    assert_eq!(data_of(&mut c, 11), b"still");
}

#[test]
fn the_clients_goaway_is_reported() {
    let mut c = open();
    let mut p = 0u32.to_be_bytes().to_vec();
    p.extend(reason::NO_ERROR.to_be_bytes());
    feed(&mut c, &frame(GOAWAY, 0, 0, &p)).unwrap();
    assert_eq!(
        events(&mut c),
        vec![Event::GoAway {
            last_stream: 0,
            code: 0
        }]
    );
    assert!(c.going_away());
    // The client's GOAWAY concerns streams we would open: its own new
    // requests are still served.
    request(&mut c, 1);
}

#[test]
fn protocol_violations_are_connection_errors() {
    let cases: Vec<Vec<u8>> = vec![
        frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2]),
        frame(DATA, 0, 0, b"x"),
        frame(DATA, 0, 5, b"x"),
        frame(HEADERS, END_HEADERS, 2, &request_fields(None)),
        frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 0]),
        frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()),
        frame(PING, 0, 0, b"short"),
        frame(SETTINGS, 0, 1, &[]),
        frame(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 2]),
        frame(SETTINGS, ACK, 0, &[0, 2, 0, 0, 0, 0]),
        frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]),
        frame(PRIORITY, 0, 0, &[0; 5]),
        // Larger than the 16 KiB we advertised.
        frame(DATA, 0, 1, &vec![0; 16_385]),
    ];
    for bytes in cases {
        let mut c = open();
        assert!(feed(&mut c, &bytes).is_err(), "{:?}", &bytes[..9]);
        let f = response_frames(&mut c);
        assert_eq!(f.last().unwrap().ty, GOAWAY);
        // Nothing more is read.
        assert!(feed(&mut c, &frame(PING, 0, 0, b"12345678")).is_err());
    }
}

#[test]
fn an_idle_connection_holds_no_buffers() {
    let mut c = open();
    assert_eq!(c.buffered_capacity(), 0);
    request(&mut c, 1);
    c.send_head(1, &[], false).unwrap();
    feed(&mut c, &frame(DATA, END_STREAM, 1, b"payload")).unwrap();
    events(&mut c);
    assert_eq!(data_of(&mut c, 1), b"payload");
    c.send_data(1, Bytes::from_static(b"answer")).unwrap();
    c.send_trailers(1, &[("grpc-status", "0")]).unwrap();
    c.take_output();
    c.release(1);
    events(&mut c);
    assert_eq!(c.buffered_capacity(), 0);
}

#[test]
fn the_first_streams_take_one_slot_each() {
    let mut c = open();
    request(&mut c, 1);
    assert_eq!(
        c.buffered_capacity(),
        stream_state_size::<()>(),
        "one stream, one slot"
    );
    request(&mut c, 3);
    assert_eq!(c.buffered_capacity(), 2 * stream_state_size::<()>());
    eprintln!("stream state: {} bytes", stream_state_size::<()>());
}

/// Issue 39, finding 4: nothing of the caller's read buffer is kept (a
/// slice would keep all of it alive), pieces queued behind others share
/// blocks, and the windows come back only as the caller uses the bytes.
#[test]
fn payload_is_copied_out_and_its_window_comes_back_once_used() {
    let mut c = open();
    request(&mut c, 1);
    let mut bytes = Vec::new();
    for k in 0..100u8 {
        bytes.extend(frame(DATA, 0, 1, &[k; 100]));
        // An unknown frame type between the pieces (ignored).
        bytes.extend(frame(0xfa, 0, 0, &[0; 900]));
    }
    let mut buf = BytesMut::from(&bytes[..]);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + bytes.len();
    c.recv(&mut buf).unwrap();
    assert!(buf.is_empty());
    assert_eq!(c.received_held(), 10_000);
    let blocks = std::iter::from_fn(|| match c.take_data(1) {
        Recv::Data(b) => Some(b),
        _ => None,
    })
    .collect::<Vec<_>>();
    assert!(
        blocks
            .iter()
            .all(|b| !range.contains(&(b.as_ptr() as usize))),
        "copied"
    );
    assert_eq!(
        blocks.len(),
        2,
        "the first piece alone, the other 99 packed"
    );
    assert_eq!(blocks.iter().map(Bytes::len).sum::<usize>(), 10_000);
    // Taken, not used: still held against the windows, no WINDOW_UPDATE.
    assert_eq!(c.received_held(), 10_000);
    assert!(!parse(&c.take_output())
        .iter()
        .any(|f| f.ty == WINDOW_UPDATE));
    // Used: a quarter of the stream window (cfg: 1 MiB) is not owed yet;
    // of the connection's 2 MiB neither. Use the rest of a quarter
    // window's worth.
    c.consumed(1, 10_000);
    assert_eq!(c.received_held(), 0);
    // More than was taken is not given back.
    c.consumed(1, 1_000_000);
    let quarter = (1 << 20) / 4;
    let mut more = Vec::new();
    for _ in 0..(quarter / 16_000) + 1 {
        more.extend(frame(DATA, 0, 1, &[7; 16_000]));
    }
    feed(&mut c, &more).unwrap();
    let mut taken = 0;
    while let Recv::Data(b) = c.take_data(1) {
        taken += b.len();
    }
    assert!(!parse(&c.take_output())
        .iter()
        .any(|f| f.ty == WINDOW_UPDATE));
    c.consumed(1, taken);
    let out = parse(&c.take_output());
    let updates: Vec<u32> = out
        .iter()
        .filter(|f| f.ty == WINDOW_UPDATE)
        .map(|f| f.id)
        .collect();
    assert_eq!(
        updates,
        [1],
        "the stream's window once a quarter of it was used"
    );
}

#[test]
fn a_head_past_the_clients_frame_size_goes_out_in_continuation_frames() {
    let mut c = open();
    request(&mut c, 1);
    let long = "x".repeat(20_000);
    c.send_head(1, &[("x-long", &long)], true).unwrap();
    let f = response_frames(&mut c);
    assert_eq!(
        f.len(),
        2,
        "{:?}",
        f.iter().map(|f| f.ty).collect::<Vec<_>>()
    );
    assert_eq!((f[0].ty, f[0].flags), (HEADERS, END_STREAM));
    assert_eq!(f[0].payload.len(), 16_384);
    assert_eq!((f[1].ty, f[1].flags), (CONTINUATION, END_HEADERS));
    let block: Vec<u8> = f.iter().flat_map(|f| f.payload.clone()).collect();
    let mut d = loona_hpack::Decoder::new();
    let fields = decode(&mut d, &block);
    assert_eq!(fields[0], (":status".to_string(), "200".to_string()));
    assert_eq!(fields[1], ("x-long".to_string(), long));
}

/// The RST_STREAM frames in `f`: (stream, code).
fn resets(f: &[F]) -> Vec<(u32, u32)> {
    f.iter()
        .filter(|f| f.ty == RST_STREAM)
        .map(|f| {
            let p = &f.payload;
            (f.id, u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        })
        .collect()
}

fn goaway_code(f: &[F]) -> Option<u32> {
    f.iter().find(|f| f.ty == GOAWAY).map(|g| {
        let p = &g.payload;
        u32::from_be_bytes([p[4], p[5], p[6], p[7]])
    })
}

/// A request whose head ends the request (no body).
fn request_ended(c: &mut Conn, id: u32) {
    feed(
        c,
        &frame(HEADERS, END_HEADERS | END_STREAM, id, &request_fields(None)),
    )
    .unwrap();
    match events(c).as_slice() {
        [Event::Request { stream, .. }] => assert_eq!(*stream, id),
        e => panic!("{e:?}"),
    }
}

/// N1: grpc-go counts a stream against our SETTINGS_MAX_CONCURRENT_STREAMS
/// until it receives our END_STREAM or a RST_STREAM, or sends its own
/// RST_STREAM (internal/transport/http2_client.go: closeStream gives the
/// stream quota back). A stream over on the wire must not count while the
/// caller still holds it, or grpc-go's next stream is refused.
#[test]
fn streams_over_on_the_wire_do_not_count_against_the_limit() {
    let mut c = open();
    for id in [1, 3, 5, 7] {
        request(&mut c, id);
    }
    // 1: answered in full (trailers-only); 3: the client reset it.
    c.send_head(1, &[("grpc-status", "0")], true).unwrap();
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 3, &reason::CANCEL.to_be_bytes()),
    )
    .unwrap();
    events(&mut c);
    c.take_output();
    // Neither is released yet (their tasks still hold them): two new
    // streams fit, a third does not.
    request(&mut c, 9);
    request(&mut c, 11);
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 13, &request_fields(None)),
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![]);
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(13, reason::REFUSED_STREAM)]
    );
    // A response ended with trailers behind its data counts until the
    // trailers are out.
    c.send_head(5, &[], false).unwrap();
    c.send_trailers(5, &[("grpc-status", "0")]).unwrap();
    c.take_output();
    request(&mut c, 15);
}

/// RFC 9113 5.1.1: a new stream's id must be above every earlier one; a
/// lower one is a connection error (it was silently dropped, and the
/// client waited for an answer forever).
#[test]
fn a_new_stream_below_the_last_one_is_a_connection_error() {
    let mut c = open();
    request(&mut c, 5);
    let e = feed(
        &mut c,
        &frame(HEADERS, END_HEADERS | END_STREAM, 3, &request_fields(None)),
    )
    .unwrap_err();
    assert_eq!(e.code, reason::PROTOCOL_ERROR);
    assert_eq!(
        goaway_code(&response_frames(&mut c)),
        Some(reason::PROTOCOL_ERROR)
    );
}

/// RFC 9113 5.1: HEADERS on a half-closed (remote) stream is a stream
/// error STREAM_CLOSED; once the stream is closed and forgotten, HEADERS
/// on it is a connection error.
#[test]
fn headers_after_the_request_ended_are_stream_closed() {
    let mut c = open();
    request_ended(&mut c, 1);
    let again = frame(HEADERS, END_HEADERS | END_STREAM, 1, &request_fields(None));
    feed(&mut c, &again).unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::STREAM_CLOSED)]
    );
    assert!(c.error().is_none());
    events(&mut c);
    request_ended(&mut c, 3);
    c.send_head(3, &[("grpc-status", "12")], true).unwrap();
    c.release(3);
    c.take_output();
    let again = frame(HEADERS, END_HEADERS | END_STREAM, 3, &request_fields(None));
    assert!(feed(&mut c, &again).is_err());
    assert!(goaway_code(&response_frames(&mut c)).is_some());
}

/// RFC 9113 8.1: trailers carrying a pseudo-header make the request
/// malformed (they were taken as a normal end of the request).
#[test]
fn trailers_with_a_pseudo_header_are_malformed() {
    let mut c = open();
    request(&mut c, 1);
    let t = fields(&[(":path", "/x"), ("grpc-status", "0")]);
    feed(&mut c, &frame(HEADERS, END_HEADERS | END_STREAM, 1, &t)).unwrap();
    events(&mut c);
    assert_eq!(c.take_data(1), Recv::Reset(reason::PROTOCOL_ERROR));
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::PROTOCOL_ERROR)]
    );
    // Plain trailers still end a request.
    request(&mut c, 3);
    let t = fields(&[("x-trailer", "ok")]);
    feed(&mut c, &frame(HEADERS, END_HEADERS | END_STREAM, 3, &t)).unwrap();
    events(&mut c);
    assert_eq!(c.take_data(3), Recv::End);
}

fn request_with_length(c: &mut Conn, id: u32, length: &str) {
    let f = fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROXY),
        ("content-length", length),
    ]);
    feed(c, &frame(HEADERS, END_HEADERS, id, &f)).unwrap();
    match events(c).as_slice() {
        [Event::Request { stream, .. }] => assert_eq!(*stream, id),
        e => panic!("{e:?}"),
    }
}

/// RFC 9113 8.1.1: a content-length that does not match the DATA received
/// makes the request malformed: a stream error PROTOCOL_ERROR.
#[test]
fn content_length_must_match_the_data() {
    let mut c = open();
    // More DATA than announced: reset as soon as it shows.
    request_with_length(&mut c, 1, "1");
    feed(&mut c, &frame(DATA, END_STREAM, 1, b"test")).unwrap();
    events(&mut c);
    assert_eq!(c.take_data(1), Recv::Reset(reason::PROTOCOL_ERROR));
    // Less: reset at the end.
    request_with_length(&mut c, 3, "10");
    feed(&mut c, &frame(DATA, 0, 3, b"test")).unwrap();
    events(&mut c);
    assert_eq!(data_of(&mut c, 3), b"test");
    feed(&mut c, &frame(DATA, END_STREAM, 3, b"ab")).unwrap();
    events(&mut c);
    assert_eq!(c.take_data(3), Recv::Reset(reason::PROTOCOL_ERROR));
    // Exactly: a normal end.
    request_with_length(&mut c, 5, "4");
    feed(&mut c, &frame(DATA, END_STREAM, 5, b"test")).unwrap();
    events(&mut c);
    assert_eq!(data_of(&mut c, 5), b"test");
    assert_eq!(c.take_data(5), Recv::End);
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::PROTOCOL_ERROR), (3, reason::PROTOCOL_ERROR)]
    );
    // Not a number, or a body announced on a request without one.
    let bad = fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROXY),
        ("content-length", "x1"),
    ]);
    feed(&mut c, &frame(HEADERS, END_HEADERS, 7, &bad)).unwrap();
    let none = fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROXY),
        ("content-length", "3"),
    ]);
    feed(&mut c, &frame(HEADERS, END_HEADERS | END_STREAM, 9, &none)).unwrap();
    assert_eq!(events(&mut c), vec![]);
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(7, reason::PROTOCOL_ERROR), (9, reason::PROTOCOL_ERROR)]
    );
}

/// A response may end before the request does (RFC 9113 8.1): the stream
/// stays known, without its caller, until the client ends its side, so
/// what the client still sends is checked (and its DATA dropped) rather
/// than cut off by a RST_STREAM.
#[test]
fn an_answered_request_is_checked_until_the_client_ends_it() {
    let mut c = open();
    request_with_length(&mut c, 1, "1");
    c.send_head(1, &[("grpc-status", "12")], true).unwrap();
    c.release(1);
    assert!(resets(&response_frames(&mut c)).is_empty());
    feed(&mut c, &frame(DATA, END_STREAM, 1, b"test")).unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::PROTOCOL_ERROR)]
    );
    assert_eq!(c.stream_count(), 0);
    // Trailers without END_STREAM (RFC 9113 8.1).
    request(&mut c, 3);
    c.send_head(3, &[("grpc-status", "12")], true).unwrap();
    c.release(3);
    feed(&mut c, &frame(DATA, 0, 3, b"test")).unwrap();
    let t = fields(&[("x-test", "ok")]);
    feed(&mut c, &frame(HEADERS, END_HEADERS, 3, &t)).unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(3, reason::PROTOCOL_ERROR)]
    );
    // The client's end forgets it.
    request(&mut c, 5);
    c.send_head(5, &[("grpc-status", "0")], true).unwrap();
    c.release(5);
    feed(&mut c, &frame(DATA, END_STREAM, 5, b"late")).unwrap();
    assert!(resets(&response_frames(&mut c)).is_empty());
    assert_eq!(c.stream_count(), 0);
    assert_eq!(c.buffered_capacity(), 0);
}

/// RFC 9113 5.1: DATA on a closed stream is a stream error STREAM_CLOSED,
/// answered once; after a RST_STREAM of ours, what was in flight is
/// ignored.
#[test]
fn data_on_a_closed_stream_is_stream_closed_unless_we_reset_it() {
    let mut c = open();
    request_ended(&mut c, 1);
    c.send_head(1, &[("grpc-status", "0")], true).unwrap();
    c.release(1);
    c.take_output();
    feed(&mut c, &frame(DATA, 0, 1, b"x")).unwrap();
    feed(&mut c, &frame(DATA, 0, 1, b"y")).unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::STREAM_CLOSED)]
    );
    // The client reset 3: anything after its RST_STREAM is an error.
    request(&mut c, 3);
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 3, &reason::CANCEL.to_be_bytes()),
    )
    .unwrap();
    feed(&mut c, &frame(DATA, 0, 3, b"x")).unwrap();
    events(&mut c);
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(3, reason::STREAM_CLOSED)]
    );
    // We reset 5 (and forgot it): its DATA and trailers in flight are
    // ignored.
    request(&mut c, 5);
    c.reset(5, reason::CANCEL);
    c.release(5);
    c.take_output();
    feed(&mut c, &frame(DATA, 0, 5, b"x")).unwrap();
    let t = fields(&[("x-test", "ok")]);
    feed(&mut c, &frame(HEADERS, END_HEADERS | END_STREAM, 5, &t)).unwrap();
    assert!(c.error().is_none());
    assert!(response_frames(&mut c).is_empty());
}

/// RFC 9113 5.3.1: a stream cannot depend on itself (stream error
/// PROTOCOL_ERROR), in HEADERS or PRIORITY.
#[test]
fn a_stream_depending_on_itself_is_a_stream_error() {
    let mut c = open();
    let mut p = 1u32.to_be_bytes().to_vec();
    p.push(255);
    p.extend(request_fields(None));
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS | END_STREAM | PRIORITY_FLAG, 1, &p),
    )
    .unwrap();
    assert_eq!(events(&mut c), vec![]);
    let mut q = 3u32.to_be_bytes().to_vec();
    q.push(255);
    feed(&mut c, &frame(PRIORITY, 0, 3, &q)).unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(1, reason::PROTOCOL_ERROR), (3, reason::PROTOCOL_ERROR)]
    );
    // Stream 3 was not opened by it.
    request(&mut c, 3);
}

/// RFC 7541 4.2: a dynamic table size update must come first in a block;
/// one at the end is a decoding error (COMPRESSION_ERROR).
#[test]
fn a_table_size_update_at_the_end_of_a_block_is_a_compression_error() {
    let mut c = open();
    let mut b = request_fields(None);
    b.push(0x3f);
    b.push(0xe1);
    b.push(0x1f); // size update to 4,096
    let e = feed(&mut c, &frame(HEADERS, END_HEADERS | END_STREAM, 1, &b)).unwrap_err();
    assert_eq!(e.code, reason::COMPRESSION_ERROR);
}

/// HEADERS + RST_STREAM pairs (CVE-2023-44487, "rapid reset") for the
/// streams `first`, `first + 2`, ... (`n` of them), in one piece.
fn rapid_resets(first: u32, n: u32) -> Vec<u8> {
    let mut b = Vec::new();
    for k in 0..n {
        let id = first + 2 * k;
        b.extend(frame(HEADERS, END_HEADERS, id, &request_fields(None)));
        b.extend(frame(RST_STREAM, 0, id, &reason::CANCEL.to_be_bytes()));
    }
    b
}

#[test]
fn rapid_reset_is_answered_with_goaway_enhance_your_calm() {
    let mut c = open();
    // 10,000 streams opened and reset before the caller took any: the
    // connection ends early (GOAWAY ENHANCE_YOUR_CALM), without keeping a
    // stream or an event per attempt.
    let err = feed(&mut c, &rapid_resets(1, 10_000)).unwrap_err();
    assert_eq!(err.code, reason::ENHANCE_YOUR_CALM);
    assert_eq!(
        goaway_code(&response_frames(&mut c)),
        Some(reason::ENHANCE_YOUR_CALM)
    );
    assert_eq!(c.flood(), Some(Flood::RapidReset));
    assert!(c.stream_count() <= 2 * MAX_PENDING_RESETS);
    assert!(events(&mut c).len() <= 4 * MAX_PENDING_RESETS);
}

#[test]
fn streams_reset_after_the_caller_took_them_are_no_flood() {
    // A client that cancels calls it made (the caller saw each) is fine,
    // however many: 1,000 of them, and a few rapid ones at a time.
    let mut c = open();
    let mut id = 1;
    for _ in 0..1_000 {
        request(&mut c, id);
        feed(
            &mut c,
            &frame(RST_STREAM, 0, id, &reason::CANCEL.to_be_bytes()),
        )
        .unwrap();
        assert_eq!(events(&mut c), vec![Event::Wake(id)]);
        c.release(id);
        id += 2;
    }
    for _ in 0..100 {
        feed(&mut c, &rapid_resets(id, MAX_PENDING_RESETS as u32)).unwrap();
        for e in events(&mut c) {
            if let Event::Request { stream, .. } = e {
                c.release(stream);
            }
        }
        id += 2 * MAX_PENDING_RESETS as u32;
    }
    assert!(c.error().is_none());
    assert_eq!(c.flood(), None);
    request(&mut c, id);
}

/// Issue 39, finding 12 ("MadeYouReset", CVE-2025-8671): a client that
/// makes us reset its streams with its own errors (here a WINDOW_UPDATE of
/// 0 on each, a stream error) frees a slot with each while the caller's
/// work goes on; past [`MAX_ERROR_RESETS`] of them the connection ends
/// with GOAWAY ENHANCE_YOUR_CALM, as the h2 crate ends it.
#[test]
fn streams_reset_for_the_clients_errors_are_counted() {
    let mut c = open();
    let mut id = 1;
    let mut ended = None;
    for k in 0..2 * MAX_ERROR_RESETS {
        let mut b = frame(HEADERS, END_HEADERS, id, &request_fields(None));
        b.extend(frame(WINDOW_UPDATE, 0, id, &0u32.to_be_bytes()));
        if let Err(e) = feed(&mut c, &b) {
            ended = Some((k, e));
            break;
        }
        for e in events(&mut c) {
            if let Event::Request { stream, .. } = e {
                c.release(stream);
            }
        }
        c.take_output();
        id += 2;
    }
    let (k, err) = ended.expect("the connection ended");
    assert_eq!(k, MAX_ERROR_RESETS, "ended after {k} resets");
    assert_eq!(err.code, reason::ENHANCE_YOUR_CALM);
    assert_eq!(c.flood(), Some(Flood::ErrorResets));
    assert_eq!(
        goaway_code(&response_frames(&mut c)),
        Some(reason::ENHANCE_YOUR_CALM)
    );
}

/// The resets a client makes us send for streams we keep no state of
/// count as well: a stream refused past the concurrency limit, a new
/// request reset as malformed, a stream that depends on itself. The h2
/// crate counts its refusals (`count_pending_refusal`) and every reset of
/// its own toward `max_local_error_reset_streams`; the differential test
/// against it (tests/h2_differential.rs) found them uncounted here, so a
/// client could have them sent without end. Refusals of streams past our
/// GOAWAY are not counted: a client has them in flight before it sees it.
#[test]
fn refused_malformed_and_self_dependent_streams_count_as_error_resets() {
    let malformed = fields(&[(":method", "POST"), (":path", PROXY)]);
    type Bad<'a> = dyn Fn(u32) -> Vec<u8> + 'a;
    let kinds: [(&str, &Bad<'_>); 4] = [
        ("refused", &|id| {
            frame(HEADERS, END_HEADERS, id, &request_fields(None))
        }),
        ("malformed", &|id| {
            frame(HEADERS, END_HEADERS | END_STREAM, id, &malformed)
        }),
        ("HEADERS on itself", &|id| {
            let mut p = id.to_be_bytes().to_vec();
            p.push(15);
            p.extend(request_fields(None));
            frame(HEADERS, END_HEADERS | PRIORITY_FLAG, id, &p)
        }),
        ("PRIORITY on itself", &|id| {
            let mut p = id.to_be_bytes().to_vec();
            p.push(15);
            frame(PRIORITY, 0, id, &p)
        }),
    ];
    for (what, bad) in kinds {
        let mut c = open();
        // The concurrency limit (4) reached, the streams kept.
        for id in [1, 3, 5, 7] {
            request(&mut c, id);
        }
        let mut id = 9;
        let mut ended = None;
        for k in 0..2 * MAX_ERROR_RESETS {
            if let Err(e) = feed(&mut c, &bad(id)) {
                ended = Some((k, e));
                break;
            }
            assert_eq!(events(&mut c), vec![], "{what}");
            assert_eq!(resets(&parse(&c.take_output())).len(), 1, "{what}");
            id += 2;
        }
        let (k, err) = ended.unwrap_or_else(|| panic!("{what}: the connection lives on"));
        assert_eq!(k, MAX_ERROR_RESETS, "{what}: ended after {k} resets");
        assert_eq!(err.code, reason::ENHANCE_YOUR_CALM, "{what}");
        assert_eq!(c.flood(), Some(Flood::ErrorResets), "{what}");
    }
    // Past our GOAWAY, refusals are the client's streams in flight.
    let mut c = open();
    c.go_away();
    c.take_output();
    let mut id = 1;
    for _ in 0..2 * MAX_ERROR_RESETS {
        feed(
            &mut c,
            &frame(HEADERS, END_HEADERS, id, &request_fields(None)),
        )
        .unwrap();
        assert_eq!(
            resets(&parse(&c.take_output())),
            vec![(id, reason::REFUSED_STREAM)]
        );
        id += 2;
    }
}

/// The bounds are checked after each frame, not after each read: one read
/// of 2,000 malformed requests gets 1,024 RST_STREAMs and the GOAWAY, not
/// 2,000 (a 64 KiB read holds 3,000 of them), as the h2 crate sends.
#[test]
fn error_resets_stop_at_the_bound_within_one_read() {
    let malformed = fields(&[(":method", "POST"), (":path", PROXY)]);
    let mut c = open();
    let mut b = Vec::new();
    for k in 0..2 * MAX_ERROR_RESETS {
        b.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1 + 2 * k,
            &malformed,
        ));
    }
    let err = feed(&mut c, &b).unwrap_err();
    assert_eq!(c.flood(), Some(Flood::ErrorResets), "{err:?}");
    let out = parse(&c.take_output());
    assert_eq!(resets(&out).len(), MAX_ERROR_RESETS as usize);
    assert_eq!(goaway_code(&out), Some(reason::ENHANCE_YOUR_CALM));
}

/// The caller's read loop takes frames in budgets (a read of tiny frames
/// is thousands of them): the frames past the budget stay in the input.
#[test]
fn recv_at_most_leaves_the_frames_past_its_budget() {
    let mut c = open();
    let pings: Vec<u8> = (0..10)
        .flat_map(|_| frame(PING, 0, 0, b"12345678"))
        .collect();
    let mut buf = BytesMut::from(&pings[..]);
    assert_eq!(c.recv_at_most(&mut buf, 4).unwrap(), 0);
    assert_eq!(buf.len(), 6 * 17, "six PINGs left");
    assert_eq!(parse(&c.take_output()).len(), 4, "four answered");
    assert_eq!(c.recv_at_most(&mut buf, 100).unwrap(), 94);
    assert!(buf.is_empty());
    assert_eq!(parse(&c.take_output()).len(), 6);
    // Without a budget, as before.
    feed(&mut c, &pings).unwrap();
    assert_eq!(parse(&c.take_output()).len(), 10);
}

#[test]
fn empty_continuation_frames_are_bounded() {
    let mut c = open();
    let block = request_fields(None);
    let mut bytes = frame(HEADERS, 0, 1, &block);
    for _ in 0..100_000 {
        bytes.extend(frame(CONTINUATION, 0, 1, &[]));
    }
    let err = feed(&mut c, &bytes).unwrap_err();
    assert_eq!(err.code, reason::ENHANCE_YOUR_CALM);
    assert_eq!(
        goaway_code(&response_frames(&mut c)),
        Some(reason::ENHANCE_YOUR_CALM)
    );
    assert_eq!(c.flood(), Some(Flood::Continuation));

    // A head split into as many frames as a tight packing of the largest
    // header list takes (plus a few) still goes through.
    let mut c = open();
    let mut bytes = frame(HEADERS, 0, 1, &block[..1]);
    for _ in 0..4 {
        bytes.extend(frame(CONTINUATION, 0, 1, &[]));
    }
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, &block[1..]));
    feed(&mut c, &bytes).unwrap();
    assert!(matches!(
        events(&mut c).as_slice(),
        [Event::Request { stream: 1, .. }]
    ));
    assert_eq!(c.flood(), None);
}

/// A stream's end counts against the concurrency limit until it is
/// written: the client cannot have seen it before (grpc-go opens the next
/// stream once it read an end), and a client that does not read cannot
/// make us queue answers for stream after stream.
#[test]
fn a_streams_end_counts_until_it_is_written() {
    let mut c = open();
    for id in [1, 3, 5, 7] {
        request(&mut c, id);
    }
    c.send_head(1, &[("grpc-status", "0")], true).unwrap();
    c.send_head(3, &[], false).unwrap();
    c.send_trailers(3, &[("grpc-status", "0")]).unwrap();
    c.reset(5, reason::CANCEL);
    // Three ends queued, none written: a fifth stream is refused.
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 9, &request_fields(None)),
    )
    .unwrap();
    assert!(!events(&mut c)
        .iter()
        .any(|e| matches!(e, Event::Request { .. })));
    let f = response_frames(&mut c);
    assert_eq!(
        resets(&f),
        vec![(5, reason::CANCEL), (9, reason::REFUSED_STREAM)]
    );
    // Written (taken above): three more fit.
    for id in [11, 13, 15] {
        request(&mut c, id);
    }
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 17, &request_fields(None)),
    )
    .unwrap();
    assert_eq!(
        resets(&response_frames(&mut c)),
        vec![(17, reason::REFUSED_STREAM)]
    );
    // Written in part: the end stays counted until its last byte is out.
    c.send_head(11, &[("grpc-status", "0")], true).unwrap();
    let n = c.output_len();
    c.wrote(n - 1);
    feed(
        &mut c,
        &frame(HEADERS, END_HEADERS, 19, &request_fields(None)),
    )
    .unwrap();
    assert!(!events(&mut c)
        .iter()
        .any(|e| matches!(e, Event::Request { .. })));
    c.take_output();
    request(&mut c, 21);
}

/// A client that resets a stream stops counting it at once, even when our
/// end is queued and unwritten: so do we.
#[test]
fn a_client_reset_uncounts_a_queued_end() {
    let mut c = open();
    for id in [1, 3, 5, 7] {
        request(&mut c, id);
    }
    c.send_head(1, &[("grpc-status", "0")], true).unwrap();
    c.release(1);
    feed(
        &mut c,
        &frame(RST_STREAM, 0, 1, &reason::CANCEL.to_be_bytes()),
    )
    .unwrap();
    request(&mut c, 9);
}

/// Answers to the client's frames (PING ACKs here) may wait unwritten up
/// to MAX_UNWRITTEN_ANSWERS; one more is a flood. Written ones do not
/// count.
#[test]
fn answers_waiting_unwritten_are_bounded() {
    let ping = frame(PING, 0, 0, b"12345678");
    let mut c = open();
    for _ in 0..3 * MAX_UNWRITTEN_ANSWERS {
        feed(&mut c, &ping).unwrap();
        c.take_output();
    }
    let flood: Vec<u8> = (0..MAX_UNWRITTEN_ANSWERS)
        .flat_map(|_| ping.clone())
        .collect();
    feed(&mut c, &flood).unwrap();
    let e = feed(&mut c, &ping).unwrap_err();
    assert_eq!(e.code, reason::ENHANCE_YOUR_CALM);
    assert_eq!(c.flood(), Some(Flood::ControlFrames));
    let f = response_frames(&mut c);
    assert_eq!(f.last().map(|f| f.ty), Some(GOAWAY));
    // SETTINGS acknowledgements and refusals count the same way.
    let mut c = open();
    let settings: Vec<u8> = (0..MAX_UNWRITTEN_ANSWERS + 1)
        .flat_map(|_| frame(SETTINGS, 0, 0, &[]))
        .collect();
    assert_eq!(
        feed(&mut c, &settings).unwrap_err().code,
        reason::ENHANCE_YOUR_CALM
    );
}

/// Window credit owed while the output is past OUT_HIGH waits for it to
/// drain (a client that does not read cannot pile WINDOW_UPDATEs up), and
/// goes out as soon as a write takes it below, ahead of the data waiting
/// for room.
#[test]
fn credit_waits_while_the_output_is_full() {
    let mut c = open();
    request(&mut c, 1);
    request(&mut c, 3);
    answer_with_room(&mut c, 1);
    c.send_data(1, Bytes::from(vec![1u8; 200_000])).unwrap();
    assert!(c.output_len() >= OUT_HIGH);
    let queued = c.output().len();
    // Past half of each stream's window and of the connection's, used.
    let chunk = vec![7u8; 16_384];
    for id in [1, 3] {
        for _ in 0..40 {
            feed(&mut c, &frame(DATA, 0, id, &chunk)).unwrap();
        }
        assert_eq!(data_of(&mut c, id).len(), 40 * 16_384);
    }
    assert_eq!(
        c.output().len(),
        queued,
        "credit queued behind a full output"
    );
    // The first write that takes the output below the mark sends it all.
    let before: Vec<u8> = c.output().iter().flat_map(|b| b.to_vec()).collect();
    let n = c.output_len() - OUT_HIGH + 1;
    c.wrote(n);
    assert!(c.send_pending(1).unwrap() > 0, "data still waits");
    let mut all = before[..n].to_vec();
    all.extend(c.take_output());
    let f = parse(&all);
    let k = parse(&before).len();
    let next: Vec<(u8, u32, u32)> = f[k..k + 3]
        .iter()
        .map(|f| {
            (
                f.ty,
                f.id,
                u32::from_be_bytes(f.payload[..4].try_into().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        next,
        vec![
            (WINDOW_UPDATE, 0, 80 * 16_384),
            (WINDOW_UPDATE, 1, 40 * 16_384),
            (WINDOW_UPDATE, 3, 40 * 16_384)
        ],
        "the credit goes out ahead of the data waiting"
    );
}

/// Windows grown for a long path: the client may send that much more,
/// and credit still goes back a quarter of the configured window at a time.
#[test]
fn receive_windows_grow_on_request() {
    let mut c = open();
    request(&mut c, 1);
    c.grow_recv_windows(1, 3 << 20, 2 << 20);
    let f = response_frames(&mut c);
    let updates: Vec<(u32, u32)> = f
        .iter()
        .filter(|f| f.ty == WINDOW_UPDATE)
        .map(|f| (f.id, u32::from_be_bytes(f.payload[..4].try_into().unwrap())))
        .collect();
    assert_eq!(updates, vec![(0, 2 << 20), (1, 3 << 20)]);
    // 4 MiB on the stream now (1 configured + 3): past the configured
    // window and the connection's (2 + 2) without a flow-control error.
    let chunk = vec![1u8; 16_384];
    for _ in 0..(3 << 20) / 16_384 {
        feed(&mut c, &frame(DATA, 0, 1, &chunk)).unwrap();
    }
    assert_eq!(data_of(&mut c, 1).len(), 3 << 20);
    // A quarter of the configured windows at a time: 1 MiB / 4 and 2 MiB / 4.
    let f = response_frames(&mut c);
    let stream_updates = f
        .iter()
        .filter(|f| f.ty == WINDOW_UPDATE && f.id == 1)
        .count();
    let conn_updates = f
        .iter()
        .filter(|f| f.ty == WINDOW_UPDATE && f.id == 0)
        .count();
    assert_eq!((stream_updates, conn_updates), (12, 6));
}
