//! Criterion micro-benchmarks of the sans-I/O codec: DATA Packets encoded
//! (gRPC frame head + protobuf head, payload by reference) and decoded
//! (frame split + Packet decode, payload sliced, not copied), for 16 B,
//! 1 KiB, 16 KiB and 1 MiB payloads. Criterion reports frames per second
//! and bytes per second. `cargo bench --bench codec`; under `cargo test`
//! each case runs once as a smoke test.

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use protocol::anp::grpc_frame::FrameDecoder;
use protocol::anp::packet::{self, Frame};

const SIZES: [usize; 4] = [16, 1024, 16 * 1024, 1024 * 1024];
/// Frames per iteration, so that small payloads are not dominated by the
/// harness.
fn batch(size: usize) -> usize {
    (64 * 1024 / size).clamp(1, 256)
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode DATA");
    for size in SIZES {
        let n = batch(size);
        let payload = Bytes::from(vec![7u8; size]);
        g.throughput(Throughput::Bytes((size * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, p| {
            b.iter(|| {
                for i in 0..n {
                    black_box(packet::encode_data(i as i64 + 1, p.clone()));
                }
            })
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode DATA");
    for size in SIZES {
        let n = batch(size);
        // One contiguous wire buffer holding n framed DATA packets.
        let mut wire = BytesMut::new();
        for i in 0..n {
            let e = packet::encode_data(i as i64 + 1, Bytes::from(vec![7u8; size]));
            wire.extend_from_slice(&e.head);
            wire.extend_from_slice(&e.payload);
        }
        let wire = wire.freeze();
        g.throughput(Throughput::Bytes((size * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &wire, |b, w| {
            b.iter(|| {
                let mut d = FrameDecoder::new(4 << 20);
                d.push(w.clone());
                let mut frames = 0;
                while let Some(msg) = d.next_message().expect("valid frames") {
                    match packet::decode(msg).expect("valid packet") {
                        Frame::Data(d) => {
                            black_box(d);
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                    frames += 1;
                }
                assert_eq!(frames, n);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
