//! OpenAI's sampling parameters and request labels through the HTTP front
//! on the default model, with the official `openai` package.

use crate::harness::Cluster;

#[test]
fn openai_sampling_parameters_through_the_http_front() {
    let cluster = Cluster::start("cache_aware", 1);
    let front = crate::harness::http_front(&cluster);
    let base = front.base_url();
    crate::harness::openai_script(
        "openai_params.py",
        &[&base, "smol"],
        "openai params checks passed",
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
