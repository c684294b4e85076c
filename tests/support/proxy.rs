//! A TCP proxy in front of the API server that a test can cut and restore: the client's view
//! of an API server that went away (connections reset, new ones refused) and came back,
//! without stopping the control plane the other tests share. Or stall: connections stay
//! open but nothing passes (a black hole: a dead route, a hung peer), until restored, when
//! the held connections are reset (as the peer's eventual RST would). TLS passes through untouched
//! (the serving certificate is for 127.0.0.1, which the proxy also is).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (is_cut, is_stalled, gen_tx) = (cut.clone(), stalled.clone(), generation.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_cut.load(Ordering::SeqCst) {
                    drop(inbound); // refused: reset at once
                    continue;
                }
                let mut signal = gen_tx.subscribe();
                let is_stalled = is_stalled.clone();
                tokio::spawn(async move {
                    if is_stalled.load(Ordering::SeqCst) {
                        // Accepted, never answered: held until restored.
                        let _ = signal.changed().await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = signal.changed() => {
                            if is_stalled.load(Ordering::SeqCst) {
                                // Both ends stay open, nothing is copied: wait for restore.
                                let _ = signal.changed().await;
                            }
                        }
                    }
                });
            }
        });
        Proxy { addr, cut, stalled, generation, task }
    }

    /// Drop every open connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Stop forwarding on every open connection and on new ones, without closing any.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
        if self.stalled.swap(false, Ordering::SeqCst) {
            // The held connections are reset; new ones forward again.
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// A copy of `kubeconfig` whose server is this proxy, written to `path`.
    pub fn kubeconfig(&self, kubeconfig: &str, path: &std::path::Path) {
        let text = std::fs::read_to_string(kubeconfig).unwrap_or_else(|e| panic!("reading {kubeconfig}: {e}"));
        let rewritten: String = text
            .lines()
            .map(|l| match l.split_once("server: ") {
                Some((indent, _)) => format!("{indent}server: https://{}", self.addr),
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(path, rewritten).expect("writing the proxied kubeconfig");
    }
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
        self.cut();
        self.task.abort();
    }
}
