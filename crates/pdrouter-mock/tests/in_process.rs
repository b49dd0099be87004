//! Several workers in one process (`--pairs`): a Decode worker's KV rendezvous with a
//! Prefill worker of the same process waits on its rooms in memory. Its own test binary,
//! because the switch is process-wide.

mod common;

use common::{TIMEOUT, wait_until};
use pdrouter_mock::{MockConfig, MockWorker, Role};
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::scheduler::{GenerateRequest, generate_response::Response};
use tonic::transport::Channel;

async fn start(role: Role) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    cfg.output_tokens = 3;
    MockWorker::start(cfg).await.expect("start gRPC mock")
}

async fn client(w: &MockWorker) -> SglangSchedulerClient<Channel> {
    common::grpc_client(w.addr()).await
}

fn request(id: &str, port: u16, room: i32) -> GenerateRequest {
    common::grpc_request(id, "hi", Some((port, room)))
}

/// The number of chunks of a stream that ends with a complete.
async fn chunks(mut c: SglangSchedulerClient<Channel>, req: GenerateRequest) -> usize {
    let mut s = c.generate(req).await.unwrap().into_inner();
    let mut n = 0;
    loop {
        match s.message().await.unwrap().and_then(|m| m.response) {
            Some(Response::Chunk(_)) => n += 1,
            Some(Response::Complete(_)) => return n,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_decode_waits_for_its_prefill_in_memory() {
    pdrouter_mock::rendezvous_in_process();
    let p = start(Role::Prefill).await;
    let d = start(Role::Decode).await;
    let port = p.addr().port();
    let (pc, dc) = (client(&p).await, client(&d).await);
    let connections = p.stats().connections_total;

    p.controls().set_hang(true);
    let decode = tokio::spawn(chunks(dc, request("pd-1", port, 42)));
    let prefill = tokio::spawn(chunks(pc, request("pd-1", port, 42)));
    wait_until("both legs in flight", || async {
        p.stats().inflight == 1 && d.stats().inflight == 1
    })
    .await;
    tokio::task::yield_now().await;
    assert!(!decode.is_finished(), "decode answered before its prefill");

    p.controls().set_hang(false);
    let done = tokio::time::timeout(TIMEOUT, async { (prefill.await, decode.await) }).await;
    let (prefill, decode) = done.expect("both legs end in time");
    assert_eq!((prefill.unwrap(), decode.unwrap()), (1, 3));
    // The Decode worker never connected to its Prefill worker: the wait was in memory.
    assert_eq!(p.stats().connections_total, connections);

    p.shutdown().await;
    d.shutdown().await;
}
