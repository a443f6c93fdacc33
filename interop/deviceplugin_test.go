// Device plugin interop: a device plugin written in Go against the upstream
// k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 types registers with `devicelet serve` the way real
// plugins do (spec devicemanager.md §1.4, §1.11), with each :authority variant Go clients send.
package interop

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	registerTimeout  = 15 * time.Second
	inventoryTimeout = 10 * time.Second
)

// goDevicePlugin is a minimal but complete v1beta1 device plugin server.
type goDevicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	devices      []*pluginapi.Device
	updates      chan []*pluginapi.Device // later snapshots sent on an open ListAndWatch stream
	stop         chan struct{}
	optionsCalls atomic.Int32
	watchCalls   atomic.Int32
}

func (p *goDevicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	p.optionsCalls.Add(1)
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *goDevicePlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	p.watchCalls.Add(1)
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	for {
		select {
		case devices := <-p.updates:
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
				return err
			}
		case <-p.stop:
			return nil
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *goDevicePlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		ids := append([]string{}, c.MustIncludeDeviceIDs...)
		for _, id := range c.AvailableDeviceIDs {
			if len(ids) >= int(c.AllocationSize) {
				break
			}
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *goDevicePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"INTEROP_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

// interopDevices: two devices on NUMA node 0, one unhealthy device on node 1, one device with no
// topology. Capacity 4, allocatable 3.
func interopDevices() []*pluginapi.Device {
	numa := func(ids ...int64) *pluginapi.TopologyInfo {
		info := &pluginapi.TopologyInfo{}
		for _, id := range ids {
			info.Nodes = append(info.Nodes, &pluginapi.NUMANode{ID: id})
		}
		return info
	}
	return []*pluginapi.Device{
		{ID: "dev-0", Health: pluginapi.Healthy, Topology: numa(0)},
		{ID: "dev-1", Health: pluginapi.Healthy, Topology: numa(0)},
		{ID: "dev-2", Health: pluginapi.Unhealthy, Topology: numa(1)},
		{ID: "dev-3", Health: pluginapi.Healthy},
	}
}

// startGoPlugin serves the plugin with interopDevices on socketPath until the end of the test.
func startGoPlugin(t *testing.T, socketPath string) *goDevicePlugin {
	t.Helper()
	plugin, _ := startGoPluginWith(t, socketPath, interopDevices())
	return plugin
}

// startGoPluginWith serves a plugin with the given devices on socketPath. The returned stop
// function ends its ListAndWatch streams and stops the server (the plugin "dies"); it also runs
// at the end of the test.
func startGoPluginWith(t *testing.T, socketPath string, devices []*pluginapi.Device) (*goDevicePlugin, func()) {
	t.Helper()
	plugin := &goDevicePlugin{devices: devices, updates: make(chan []*pluginapi.Device), stop: make(chan struct{})}
	_ = os.Remove(socketPath)
	lis, err := net.Listen("unix", socketPath)
	if err != nil {
		t.Fatalf("plugin listen on %s: %v", socketPath, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, plugin)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = server.Serve(lis)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(plugin.stop)
			server.Stop()
			<-done
		})
	}
	t.Cleanup(stop)
	return plugin, stop
}

// unixDialer dials the address grpc-go hands it as a Unix socket path (what NVIDIA's and most
// other Go plugins do).
func unixDialer(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", addr)
}

// fixedUnixDialer ignores grpc-go's address and dials socketPath.
func fixedUnixDialer(socketPath string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socketPath)
	}
}

// dialVariant is one way a Go client dials kubelet.sock, with the :authority it produces.
type dialVariant struct {
	name          string
	id            string // short, for resource and socket names
	wantAuthority func(socketPath string) string
	dial          func(ctx context.Context, socketPath string) (*grpc.ClientConn, error)
}

var dialVariants = []dialVariant{
	{
		// grpc.Dial with a bare path, passthrough resolver and a unix dialer (NVIDIA
		// k8s-device-plugin and most Go plugins). Current grpc-go percent-encodes the endpoint,
		// so :authority is the socket path with each "/" sent as "%2F".
		name:          "a-passthrough-socket-path",
		id:            "a",
		wantAuthority: func(sock string) string { return strings.ReplaceAll(sock, "/", "%2F") },
		dial: func(ctx context.Context, sock string) (*grpc.ClientConn, error) {
			//nolint:staticcheck // DialContext/WithBlock are what real plugins still use.
			return grpc.DialContext(ctx, sock,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithBlock(),
				grpc.WithContextDialer(unixDialer))
		},
	},
	{
		// The same, as plugins built with older grpc-go releases send it: the raw socket path,
		// slashes included. hyper/h2 rejects this authority unless the server rewrites it
		// (spec devicemanager.md §1.11).
		name:          "a-raw-socket-path",
		id:            "r",
		wantAuthority: func(sock string) string { return sock },
		dial: func(ctx context.Context, sock string) (*grpc.ClientConn, error) {
			//nolint:staticcheck // see above
			return grpc.DialContext(ctx, sock,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithBlock(),
				grpc.WithContextDialer(unixDialer),
				grpc.WithAuthority(sock))
		},
	},
	{
		// "unix://" target: grpc-go's unix resolver sends :authority "localhost".
		name:          "b-unix-scheme-localhost",
		id:            "b",
		wantAuthority: func(string) string { return "localhost" },
		dial: func(ctx context.Context, sock string) (*grpc.ClientConn, error) {
			//nolint:staticcheck // see above
			return grpc.DialContext(ctx, "unix://"+sock,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithBlock())
		},
	},
	{
		// Path without its leading slash, as older grpc-go versions sent for passthrough targets.
		name:          "c-path-without-leading-slash",
		id:            "c",
		wantAuthority: func(sock string) string { return strings.TrimPrefix(sock, "/") },
		dial: func(ctx context.Context, sock string) (*grpc.ClientConn, error) {
			//nolint:staticcheck // see above
			return grpc.DialContext(ctx, sock,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithBlock(),
				grpc.WithContextDialer(unixDialer),
				grpc.WithAuthority(strings.TrimPrefix(sock, "/")))
		},
	},
	{
		// "passthrough:///" with an empty endpoint and a dialer bound to the socket: grpc-go sends
		// an empty :authority.
		name:          "d-empty-authority",
		id:            "d",
		wantAuthority: func(string) string { return "" },
		dial: func(ctx context.Context, sock string) (*grpc.ClientConn, error) {
			//nolint:staticcheck // see above
			return grpc.DialContext(ctx, "passthrough:///",
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithBlock(),
				grpc.WithContextDialer(fixedUnixDialer(sock)))
		},
	},
}

// variantByID returns the dial variant with the given id.
func variantByID(t *testing.T, id string) dialVariant {
	t.Helper()
	for _, v := range dialVariants {
		if v.id == id {
			return v
		}
	}
	t.Fatalf("no dial variant %q", id)
	return dialVariant{}
}

// authorityRecorder is a Go Registration server that records the :authority of each call; it
// proves each dial variant really sends the authority it claims to.
type authorityRecorder struct {
	pluginapi.UnimplementedRegistrationServer
	mu          sync.Mutex
	authorities []string
}

func (r *authorityRecorder) Register(ctx context.Context, _ *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.authorities = append(r.authorities, md.Get(":authority")...)
	return &pluginapi.Empty{}, nil
}

// TestDialVariantsSendTheirAuthority checks the client side of each variant against grpc-go's
// own server, independent of devicelet.
func TestDialVariantsSendTheirAuthority(t *testing.T) {
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "kubelet.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &authorityRecorder{}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, rec)
	go func() { _ = server.Serve(lis) }()
	defer server.Stop()

	for _, v := range dialVariants {
		t.Run(v.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := v.dial(ctx, sock)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer conn.Close()
			if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{}); err != nil {
				t.Fatalf("Register against grpc-go server: %v", err)
			}
			rec.mu.Lock()
			got := rec.authorities[len(rec.authorities)-1]
			rec.authorities = nil
			rec.mu.Unlock()
			if want := v.wantAuthority(sock); got != want {
				t.Fatalf(":authority = %q, want %q", got, want)
			}
		})
	}
}

// register dials kubelet.sock with the variant and calls Register.
func register(t *testing.T, v dialVariant, kubeletSock string, req *pluginapi.RegisterRequest) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	conn, err := v.dial(ctx, kubeletSock)
	if err != nil {
		return fmt.Errorf("dial %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req)
	return err
}

// checkInventory verifies capacity, allocatable and per-device health and NUMA nodes of the
// resource served by interopDevices.
func checkInventory(r resourceEntry) error {
	capacity, err := quantity(r.Capacity)
	if err != nil {
		return fmt.Errorf("capacity %s: %v", r.Capacity, err)
	}
	allocatable, err := quantity(r.Allocatable)
	if err != nil {
		return fmt.Errorf("allocatable %s: %v", r.Allocatable, err)
	}
	if capacity != 4 || allocatable != 3 {
		return fmt.Errorf("capacity/allocatable = %d/%d, want 4/3 (entry %+v)", capacity, allocatable, r)
	}
	want := map[string]struct {
		health string
		numa   []int64
	}{
		"dev-0": {pluginapi.Healthy, []int64{0}},
		"dev-1": {pluginapi.Healthy, []int64{0}},
		"dev-2": {pluginapi.Unhealthy, []int64{1}},
		"dev-3": {pluginapi.Healthy, nil},
	}
	if len(r.Devices) != len(want) {
		return fmt.Errorf("devices = %+v, want %d devices", r.Devices, len(want))
	}
	for _, d := range r.Devices {
		w, ok := want[d.ID]
		if !ok {
			return fmt.Errorf("unexpected device %+v", d)
		}
		if d.Health != w.health {
			return fmt.Errorf("device %s health = %q, want %q", d.ID, d.Health, w.health)
		}
		got := slices.Clone(d.NUMANodes)
		slices.Sort(got)
		if !slices.Equal(got, w.numa) && !(len(got) == 0 && len(w.numa) == 0) {
			return fmt.Errorf("device %s numaNodes = %v, want %v", d.ID, d.NUMANodes, w.numa)
		}
	}
	return nil
}

// TestDevicePluginRegistersWithEachAuthority registers a Go plugin through each dial variant and
// checks the inventory devicelet reports.
func TestDevicePluginRegistersWithEachAuthority(t *testing.T) {
	for _, v := range dialVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			d := startDevicelet(t)
			resource := "interop.devicelet.invalid/variant-" + v.id
			endpoint := "interop-" + v.id + ".sock"
			plugin := startGoPlugin(t, filepath.Join(d.pluginDir(), endpoint))

			err := register(t, v, d.kubeletSocket(), &pluginapi.RegisterRequest{
				Version:      pluginapi.Version,
				Endpoint:     endpoint,
				ResourceName: resource,
				Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
			})
			if err != nil {
				t.Fatalf("Register with :authority %q: %v", v.wantAuthority(d.kubeletSocket()), err)
			}
			if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
				t.Fatalf("inventory after registration: %v", err)
			}
			if plugin.optionsCalls.Load() < 1 {
				t.Errorf("devicelet never called GetDevicePluginOptions")
			}
			if plugin.watchCalls.Load() < 1 {
				t.Errorf("devicelet never opened ListAndWatch")
			}
		})
	}
}

// TestRegisterRejectsInvalidRequests checks the Register validation of spec §1.4 step 3 (and the
// fixed endpoint-escape bug): each bad request fails with a message naming the cause, and the
// resource does not appear.
func TestRegisterRejectsInvalidRequests(t *testing.T) {
	d := startDevicelet(t)
	// Use the "localhost" authority so these checks do not depend on the :authority shim.
	v := variantByID(t, "b")
	goodEndpoint := "interop-neg.sock"
	startGoPlugin(t, filepath.Join(d.pluginDir(), goodEndpoint))
	// A real plugin outside the device-plugin directory: upstream would connect to it through
	// "../x"; devicelet must refuse.
	startGoPlugin(t, filepath.Join(d.root, "x"))

	cases := []struct {
		name     string
		req      *pluginapi.RegisterRequest
		wantText []string
	}{
		{
			name:     "wrong-version",
			req:      &pluginapi.RegisterRequest{Version: "v1alpha", Endpoint: goodEndpoint, ResourceName: "interop.devicelet.invalid/version"},
			wantText: []string{`requested API version "v1alpha" is not supported`},
		},
		{
			name:     "resource-name-without-domain",
			req:      &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: goodEndpoint, ResourceName: "nodomain"},
			wantText: []string{`the ResourceName "nodomain" is invalid`},
		},
		{
			name:     "resource-name-in-kubernetes-io",
			req:      &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: goodEndpoint, ResourceName: "kubernetes.io/gpu"},
			wantText: []string{`the ResourceName "kubernetes.io/gpu" is invalid`},
		},
		{
			name:     "endpoint-escapes-plugin-dir",
			req:      &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "../x", ResourceName: "interop.devicelet.invalid/escape"},
			wantText: []string{"../x"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := register(t, v, d.kubeletSocket(), c.req)
			if err == nil {
				t.Fatalf("Register(%+v) succeeded, want an error", c.req)
			}
			st, ok := status.FromError(err)
			if !ok {
				t.Fatalf("Register error is not a gRPC status: %v", err)
			}
			t.Logf("gRPC code %s, message %q", st.Code(), st.Message())
			for _, want := range c.wantText {
				if !strings.Contains(st.Message(), want) {
					t.Errorf("error message %q does not contain %q", st.Message(), want)
				}
			}
			list, err := d.getResources()
			if err != nil {
				t.Fatal(err)
			}
			if r, found := list.findResource(c.req.ResourceName); found {
				t.Errorf("rejected resource %q is listed: %+v", c.req.ResourceName, r)
			}
		})
	}

	// The server still works after the rejections.
	if err := register(t, v, d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: goodEndpoint, ResourceName: "interop.devicelet.invalid/after-rejections",
	}); err != nil {
		t.Fatalf("valid Register after rejections: %v", err)
	}
	if err := d.waitForResource("interop.devicelet.invalid/after-rejections", inventoryTimeout, checkInventory); err != nil {
		t.Fatal(err)
	}
}
