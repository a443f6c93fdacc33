// Plugin-watcher interop: a Go device plugin registers through R/plugins_registry the way
// kubelet's plugin manager expects (spec devicemanager.md §1.8), serving the upstream
// pluginregistration.Registration and v1beta1.DevicePlugin services on one socket.
package interop

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const watcherTimeout = 15 * time.Second

// watcherRegistration is the pluginregistration.Registration side of a plugin; it reports the
// NotifyRegistrationStatus it receives on a channel.
type watcherRegistration struct {
	registerapi.UnimplementedRegistrationServer
	info     *registerapi.PluginInfo
	statuses chan *registerapi.RegistrationStatus
}

func (w *watcherRegistration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return w.info, nil
}

func (w *watcherRegistration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	select {
	case w.statuses <- s:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// startWatcherPlugin serves Registration and DevicePlugin on socketPath (the "single socket"
// layout of the kubelet's own stub: PluginInfo.endpoint empty).
func startWatcherPlugin(t *testing.T, socketPath string, info *registerapi.PluginInfo) *watcherRegistration {
	t.Helper()
	reg := &watcherRegistration{info: info, statuses: make(chan *registerapi.RegistrationStatus, 16)}
	plugin := &goDevicePlugin{devices: interopDevices(), stop: make(chan struct{})}
	if err := os.MkdirAll(filepath.Dir(socketPath), 0o755); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", socketPath)
	if err != nil {
		t.Fatalf("listen %s: %v", socketPath, err)
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, reg)
	pluginapi.RegisterDevicePluginServer(server, plugin)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = server.Serve(lis)
	}()
	t.Cleanup(func() {
		close(plugin.stop)
		server.Stop()
		<-done
	})
	return reg
}

func waitStatus(t *testing.T, reg *watcherRegistration) *registerapi.RegistrationStatus {
	t.Helper()
	select {
	case s := <-reg.statuses:
		return s
	case <-time.After(watcherTimeout):
		t.Fatalf("no NotifyRegistrationStatus within %s", watcherTimeout)
		return nil
	}
}

func TestPluginWatcherRegistersGoDevicePlugin(t *testing.T) {
	d := startDevicelet(t)
	const resource = "interop.devicelet.invalid/watcher"
	reg := startWatcherPlugin(t, filepath.Join(d.root, "plugins_registry", "interop-watcher.sock"), &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              resource,
		SupportedVersions: []string{pluginapi.Version},
	})
	status := waitStatus(t, reg)
	if !status.PluginRegistered || status.Error != "" {
		t.Fatalf("NotifyRegistrationStatus = %+v, want registered without error", status)
	}
	if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatalf("inventory after plugin-watcher registration: %v", err)
	}
}

func TestPluginWatcherReportsValidationFailures(t *testing.T) {
	d := startDevicelet(t)
	cases := []struct {
		name     string
		info     *registerapi.PluginInfo
		wantText string
	}{
		{
			name:     "unsupported-version",
			info:     &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: "interop.devicelet.invalid/oldver", SupportedVersions: []string{"v1alpha"}},
			wantText: "v1beta1",
		},
		{
			name:     "invalid-resource-name",
			info:     &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: "nodomain", SupportedVersions: []string{pluginapi.Version}},
			wantText: "nodomain",
		},
		{
			name:     "unknown-plugin-type",
			info:     &registerapi.PluginInfo{Type: "NoSuchPlugin", Name: "interop.devicelet.invalid/type", SupportedVersions: []string{pluginapi.Version}},
			wantText: "NoSuchPlugin",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := startWatcherPlugin(t, filepath.Join(d.root, "plugins_registry", "neg-"+c.name+".sock"), c.info)
			status := waitStatus(t, reg)
			if status.PluginRegistered {
				t.Fatalf("NotifyRegistrationStatus = %+v, want a failure", status)
			}
			if !strings.Contains(status.Error, c.wantText) {
				t.Errorf("status error %q does not mention %q", status.Error, c.wantText)
			}
			list, err := d.getResources()
			if err != nil {
				t.Fatal(err)
			}
			if r, found := list.findResource(c.info.Name); found {
				t.Errorf("rejected plugin %q is listed: %+v", c.info.Name, r)
			}
		})
	}
}
