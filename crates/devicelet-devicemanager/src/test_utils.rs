//! Fakes for the manager's IO seams, in the spirit of `dm/manager_test.go`'s in-process stubs:
//! a [`FakePlugin`] whose `ListAndWatch` is driven by the test, and a [`FakeDialer`] that hands
//! out fakes by socket path. Every call is recorded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use crate::error::PluginError;
use crate::plugin::{DevicePluginClient, DeviceUpdateStream, PluginDialer};
use crate::types::{
    ContainerAllocateResponse, Device, DevicePluginOptions, PreferredAllocationRequest,
};

type UpdateSender = mpsc::UnboundedSender<Result<Vec<Device>, PluginError>>;

/// How a fake answers `GetDevicePluginOptions`.
#[derive(Debug, Clone)]
pub enum OptionsBehaviour {
    /// Answers at once.
    Answer(DevicePluginOptions),
    /// Never answers.
    Hang,
    /// Fails with the given error.
    Fail(PluginError),
}

/// How a fake answers `Allocate`.
#[derive(Debug, Clone, Default)]
pub enum AllocateBehaviour {
    /// One response per container with `FAKE_DEVICES=<ids>`.
    #[default]
    Answer,
    /// Never answers.
    Hang,
    /// Fails with the given error.
    Fail(PluginError),
    /// Answers with no container response.
    Empty,
}

#[derive(Default)]
struct FakePluginState {
    allocate: AllocateBehaviour,
    preferred_answer: Option<Vec<String>>,
    preferred_requests: Vec<PreferredAllocationRequest>,
    allocate_requests: Vec<Vec<String>>,
    streams: Vec<UpdateSender>,
    pending: Vec<Result<Vec<Device>, PluginError>>,
    calls: Vec<String>,
    opened_streams: usize,
}

/// A scripted device plugin. Clones share state.
#[derive(Clone)]
pub struct FakePlugin {
    options: OptionsBehaviour,
    state: Arc<Mutex<FakePluginState>>,
}

impl FakePlugin {
    /// A plugin answering `GetDevicePluginOptions` with `options`.
    pub fn new(options: DevicePluginOptions) -> Self {
        Self::with_behaviour(OptionsBehaviour::Answer(options))
    }

    /// A plugin with the given `GetDevicePluginOptions` behaviour.
    pub fn with_behaviour(options: OptionsBehaviour) -> Self {
        FakePlugin {
            options,
            state: Arc::new(Mutex::new(FakePluginState::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FakePluginState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a snapshot on every open stream, or queues it for the next stream opened.
    pub fn send(&self, devices: Vec<Device>) {
        let mut state = self.lock();
        if state.streams.is_empty() {
            state.pending.push(Ok(devices));
        } else {
            state
                .streams
                .retain(|s| s.send(Ok(devices.clone())).is_ok());
        }
    }

    /// Fails every open stream with an error.
    pub fn fail_streams(&self, error: PluginError) {
        let mut state = self.lock();
        for stream in state.streams.drain(..) {
            let _ = stream.send(Err(error.clone()));
        }
    }

    /// Ends every open stream cleanly (EOF).
    pub fn close_streams(&self) {
        self.lock().streams.clear();
    }

    /// How many `ListAndWatch` streams were opened so far.
    pub fn opened_streams(&self) -> usize {
        self.lock().opened_streams
    }

    /// Streams still held open by the manager.
    pub fn live_streams(&self) -> usize {
        self.lock()
            .streams
            .iter()
            .filter(|s| !s.is_closed())
            .count()
    }

    /// Sets how `Allocate` answers.
    pub fn set_allocate(&self, behaviour: AllocateBehaviour) {
        self.lock().allocate = behaviour;
    }

    /// Makes `GetPreferredAllocation` answer these IDs (default: the first `size` available).
    pub fn set_preferred_answer(&self, ids: Vec<String>) {
        self.lock().preferred_answer = Some(ids);
    }

    /// `GetPreferredAllocation` requests received.
    pub fn preferred_requests(&self) -> Vec<PreferredAllocationRequest> {
        self.lock().preferred_requests.clone()
    }

    /// Device IDs of each `Allocate` container request received.
    pub fn allocate_requests(&self) -> Vec<Vec<String>> {
        self.lock().allocate_requests.clone()
    }

    /// Names of the RPCs called, in order.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    fn record(&self, call: &str) {
        self.lock().calls.push(call.to_owned());
    }
}

impl DevicePluginClient for FakePlugin {
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>> {
        self.record("GetDevicePluginOptions");
        match self.options.clone() {
            OptionsBehaviour::Answer(options) => futures::future::ready(Ok(options)).boxed(),
            OptionsBehaviour::Fail(err) => futures::future::ready(Err(err)).boxed(),
            OptionsBehaviour::Hang => futures::future::pending().boxed(),
        }
    }

    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>> {
        self.record("ListAndWatch");
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.lock();
        state.opened_streams += 1;
        for pending in state.pending.drain(..) {
            let _ = tx.send(pending);
        }
        state.streams.push(tx);
        let stream = tokio_stream_from(rx);
        futures::future::ready(Ok(stream)).boxed()
    }

    fn allocate(
        &self,
        container_device_ids: Vec<Vec<String>>,
    ) -> BoxFuture<'_, Result<Vec<ContainerAllocateResponse>, PluginError>> {
        self.record("Allocate");
        let behaviour = {
            let mut state = self.lock();
            state
                .allocate_requests
                .extend(container_device_ids.iter().cloned());
            state.allocate.clone()
        };
        match behaviour {
            AllocateBehaviour::Hang => futures::future::pending().boxed(),
            AllocateBehaviour::Fail(err) => futures::future::ready(Err(err)).boxed(),
            AllocateBehaviour::Empty => futures::future::ready(Ok(vec![])).boxed(),
            AllocateBehaviour::Answer => {
                let responses = container_device_ids
                    .into_iter()
                    .map(|ids| {
                        let mut response = ContainerAllocateResponse::default();
                        response
                            .envs
                            .insert("FAKE_DEVICES".to_owned(), ids.join(","));
                        response
                    })
                    .collect();
                futures::future::ready(Ok(responses)).boxed()
            }
        }
    }

    fn get_preferred_allocation(
        &self,
        requests: Vec<PreferredAllocationRequest>,
    ) -> BoxFuture<'_, Result<Vec<Vec<String>>, PluginError>> {
        self.record("GetPreferredAllocation");
        let fixed = {
            let mut state = self.lock();
            state.preferred_requests.extend(requests.iter().cloned());
            state.preferred_answer.clone()
        };
        if let Some(ids) = fixed {
            return futures::future::ready(Ok(vec![ids])).boxed();
        }
        let answers = requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size).unwrap_or(0);
                r.available_device_ids.into_iter().take(size).collect()
            })
            .collect();
        futures::future::ready(Ok(answers)).boxed()
    }

    fn pre_start_container(
        &self,
        _device_ids: Vec<String>,
    ) -> BoxFuture<'_, Result<(), PluginError>> {
        self.record("PreStartContainer");
        futures::future::ready(Ok(())).boxed()
    }
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Result<Vec<Device>, PluginError>>,
) -> DeviceUpdateStream {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// Hands out [`FakePlugin`]s by socket path; unknown paths fail to connect.
#[derive(Clone, Default)]
pub struct FakeDialer {
    plugins: Arc<Mutex<HashMap<PathBuf, FakePlugin>>>,
}

impl FakeDialer {
    /// An empty dialer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `plugin` reachable at `socket`.
    pub fn add(&self, socket: impl Into<PathBuf>, plugin: FakePlugin) {
        self.plugins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(socket.into(), plugin);
    }
}

impl PluginDialer for FakeDialer {
    fn dial(
        &self,
        socket: &Path,
    ) -> BoxFuture<'static, Result<Arc<dyn DevicePluginClient>, PluginError>> {
        let found = self
            .plugins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(socket)
            .cloned();
        let socket = socket.display().to_string();
        async move {
            match found {
                Some(plugin) => Ok(Arc::new(plugin) as Arc<dyn DevicePluginClient>),
                None => Err(PluginError::Connect(format!("no such socket {socket}"))),
            }
        }
        .boxed()
    }
}
