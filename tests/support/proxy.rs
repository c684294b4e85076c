//! A TCP proxy in front of the API server that a test can cut and restore: the client's view
//! of an API server that went away (connections reset, new ones refused) and came back,
//! without stopping the control plane the other tests share; or one that black-holes
//! (connections stay open and nothing gets through, as when a network path dies without a
//! reset). TLS passes through untouched (the serving certificate is for 127.0.0.1, which the
//! proxy also is).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// True while black-holing.
    holding: watch::Sender<bool>,
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (holding, _) = watch::channel(false);
        let (is_cut, gen_tx, hold_tx) = (cut.clone(), generation.clone(), holding.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_cut.load(Ordering::SeqCst) {
                    drop(inbound); // refused: reset at once
                    continue;
                }
                let mut cut_signal = gen_tx.subscribe();
                let mut hold = hold_tx.subscribe();
                tokio::spawn(async move {
                    // Accepted while black-holing: never connected, closed once it heals.
                    let held = *hold.borrow_and_update();
                    if held {
                        until(&mut hold, false).await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_signal.changed() => {}
                        // Black-holed: both ends stay open and nothing more is copied; once it
                        // heals they are closed, as a path that was dead that long leaves them.
                        () = until(&mut hold, true) => until(&mut hold, false).await,
                    }
                });
            }
        });
        Proxy { addr, cut, holding, generation, task }
    }

    /// Drop every open connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Stop forwarding without closing anything: open connections and new ones stay open and
    /// silent.
    pub fn black_hole(&self) {
        self.holding.send_replace(true);
    }

    /// End the black hole: the connections it held are closed, new ones are forwarded.
    pub fn heal(&self) {
        self.holding.send_replace(false);
    }

    /// A copy of `kubeconfig` (YAML or JSON) whose every cluster's server is this proxy,
    /// written to `path`.
    pub fn kubeconfig(&self, kubeconfig: &str, path: &std::path::Path) {
        let text = std::fs::read_to_string(kubeconfig).unwrap_or_else(|e| panic!("reading {kubeconfig}: {e}"));
        let mut config: serde_json::Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {kubeconfig}: {e}"));
        let clusters = config["clusters"].as_array_mut().expect("a kubeconfig with clusters");
        for cluster in clusters {
            cluster["cluster"]["server"] = serde_json::Value::String(format!("https://{}", self.addr));
        }
        std::fs::write(path, serde_json::to_string_pretty(&config).unwrap()).expect("writing the proxied kubeconfig");
    }
}

/// Until the black hole is (`true`) or is not (`false`) on.
async fn until(hold: &mut watch::Receiver<bool>, on: bool) {
    let _ = hold.wait_for(|h| *h == on).await;
}

/// The API server's address, from the admin kubeconfig of the test control plane.
pub fn api_server() -> SocketAddr {
    let path = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    let text = std::fs::read_to_string(&path).expect("reading the kubeconfig");
    let server = text.lines().find_map(|l| l.trim().strip_prefix("server: ")).expect("a server line");
    server.trim_start_matches("https://").parse().expect("the API server's host:port")
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.heal();
        self.cut();
        self.task.abort();
    }
}
