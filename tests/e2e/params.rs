//! OpenAI's sampling parameters and request labels through the HTTP front
//! on the default model, with the official `openai` package.

use std::process::Command;

use crate::harness::{Cluster, venv_python};

#[test]
fn openai_sampling_parameters_through_the_http_front() {
    let python = venv_python("openai");
    let cluster = Cluster::start("cache_aware", 1);
    let listen = format!("127.0.0.1:{}", crate::harness::free_port());
    let _front = crate::harness::spawn_until(
        "listening on",
        &[
            "http",
            "--router",
            &cluster.clients,
            "--listen",
            &listen,
            "--served-model-name",
            "smol",
        ],
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/e2e/openai_params.py"
    );
    let output = Command::new(&python)
        .args([script, &format!("http://{listen}/v1"), "smol"])
        .output()
        .expect("running the openai params script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("openai params checks passed"),
        "the openai params checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `embed` over the protocol: a DEALER client gets an `embedding` reply.
#[test]
fn embed_over_the_protocol() {
    use zinfer_protocol::{ClientReply, ClientRequest, EmbedRequest, Pooling};
    let cluster = Cluster::start("cache_aware", 1);
    let client = cluster.client();
    let mut vectors = Vec::new();
    for (id, pooling) in [("mean", Pooling::Mean), ("last", Pooling::Last)] {
        let mut request = EmbedRequest::text(id, "The cat sat on the mat.");
        request.pooling = Some(pooling);
        client.send(&ClientRequest::Embed(request));
        match client
            .recv(std::time::Duration::from_secs(60))
            .expect("a reply")
        {
            ClientReply::Embedding {
                id: got,
                embedding,
                usage,
                worker,
            } => {
                assert_eq!(got, id);
                assert!(usage.prompt_tokens > 0 && usage.completion_tokens == 0);
                assert!(!worker.is_empty());
                let norm: f32 = embedding.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-3, "{norm}");
                vectors.push(embedding);
            }
            other => panic!("expected an embedding, got {other:?}"),
        }
    }
    assert_eq!(vectors[0].len(), vectors[1].len());
    assert_ne!(vectors[0], vectors[1], "mean and last pooling differ");
    // A bad embed is refused by name.
    let mut bad = EmbedRequest::text("bad", "x");
    bad.tokens = Some(vec![1]);
    client.send(&ClientRequest::Embed(bad));
    match client
        .recv(std::time::Duration::from_secs(60))
        .expect("a reply")
    {
        ClientReply::Error { id, message, .. } => {
            assert_eq!(id.as_deref(), Some("bad"));
            assert!(message.contains("exactly one"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
}
