//! The accept loop: HTTP/1.1 connections over hyper, at most `max_connections` open at once
//! (the others wait in the listen backlog until one closes), each closed when a request's headers
//! take longer than `header_read_timeout` from their first byte or when it has had no request in
//! flight and no traffic for `idle_timeout`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

/// How many connections may be open and how long they may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// Connections served at once.
    pub max_connections: u32,
    /// From the first byte of a request to the end of its headers.
    pub header_read_timeout: Duration,
    /// Without a request in flight and without traffic.
    pub idle_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets the
/// requests in flight finish and returns once every connection has closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let (close_tx, close_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => match a {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors or the like: wait instead of spinning.
                    eprintln!("warning: accepting a connection failed: {e}");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        tokio::spawn(connection(
            stream,
            permit,
            router.clone(),
            limits,
            close_rx.clone(),
        ));
    }
    // Refuse what waits in the backlog, ask every connection to close after its request in
    // flight, and wait until they have.
    drop(listener);
    drop(close_tx);
    let _ = slots.acquire_many(limits.max_connections).await;
}

/// Errors of one incoming connection (the peer gave up during the handshake), not of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection until it closes, times out or the server stops.
async fn connection(
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    router: Router,
    limits: ConnLimits,
    mut close: watch::Receiver<()>,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let on_request = activity.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let serving = Serving::new(on_request.clone());
        let mut router = router.clone();
        async move {
            let _serving = serving;
            router.call(req).await
        }
    });
    let mut builder = http1::Builder::new();
    // The deadlines are kept here (hyper's header timer also runs while a connection idles).
    builder.header_read_timeout(None);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            // Dropping the connection closes the socket.
            _ = activity.expired(limits) => break,
            _ = close.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What one connection is doing, shared by its socket, its service and its deadline.
struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last_io: AtomicU64,
    /// One plus the milliseconds from `start` to the first byte of a request not yet being
    /// served; 0 when none is arriving.
    head_started: AtomicU64,
    /// Requests being served.
    in_flight: AtomicUsize,
    /// Woken when a request starts arriving, starts being served or ends.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .head_started
                .compare_exchange(0, now + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    /// Resolves once the connection has overrun its header deadline or idled too long.
    async fn expired(&self, limits: ConnLimits) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (header, idle) = (ms(limits.header_read_timeout), ms(limits.idle_timeout));
        loop {
            let now = self.now();
            let deadline = if self.in_flight.load(Ordering::Acquire) > 0 {
                None
            } else {
                match self.head_started.load(Ordering::Acquire) {
                    0 => Some(self.last_io.load(Ordering::Relaxed).saturating_add(idle)),
                    started => Some((started - 1).saturating_add(header)),
                }
            };
            match deadline {
                Some(d) if d <= now => return,
                Some(d) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(d - now)) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

/// A request being served: counted from the call of the service to its response.
struct Serving(Arc<Activity>);

impl Serving {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.head_started.store(0, Ordering::Release);
        activity.changed.notify_one();
        Self(activity)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.wrote();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// A socket that records its traffic in an [`Activity`].
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
