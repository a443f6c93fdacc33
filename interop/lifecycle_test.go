// Plugin lifecycle interop (spec devicemanager.md §1.4 steps 4-5, §1.5): re-registration of the
// same resource by a second Go plugin, the first plugin dying afterwards, and the current plugin
// dying.
package interop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// counts checks capacity and allocatable of a resource entry.
func counts(wantCapacity, wantAllocatable int64) func(resourceEntry) error {
	return func(r resourceEntry) error {
		capacity, err := quantity(r.Capacity)
		if err != nil {
			return fmt.Errorf("capacity %s: %v", r.Capacity, err)
		}
		allocatable, err := quantity(r.Allocatable)
		if err != nil {
			return fmt.Errorf("allocatable %s: %v", r.Allocatable, err)
		}
		if capacity != wantCapacity || allocatable != wantAllocatable {
			return fmt.Errorf("capacity/allocatable = %d/%d, want %d/%d (entry %+v)", capacity, allocatable, wantCapacity, wantAllocatable, r)
		}
		return nil
	}
}

func TestReRegisteredPluginSurvivesDeathOfItsPredecessor(t *testing.T) {
	d := startDevicelet(t)
	v := variantByID(t, "b")
	const resource = "interop.devicelet.invalid/rereg"

	_, stopFirst := startGoPluginWith(t, filepath.Join(d.pluginDir(), "rereg-1.sock"), interopDevices())
	if err := register(t, v, d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "rereg-1.sock", ResourceName: resource,
	}); err != nil {
		t.Fatalf("first Register: %v", err)
	}
	if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatal(err)
	}

	// A second plugin instance takes over the resource with two healthy devices; its snapshot
	// replaces the first plugin's.
	second := []*pluginapi.Device{
		{ID: "new-0", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		{ID: "new-1", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
	}
	_, stopSecond := startGoPluginWith(t, filepath.Join(d.pluginDir(), "rereg-2.sock"), second)
	if err := register(t, v, d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "rereg-2.sock", ResourceName: resource,
	}); err != nil {
		t.Fatalf("second Register: %v", err)
	}
	if err := d.waitForResource(resource, inventoryTimeout, counts(2, 2)); err != nil {
		t.Fatalf("after re-registration: %v", err)
	}

	// The first plugin dies. Upstream bug (k8s #121994): the kubelet then disconnects the new
	// plugin. devicelet must keep the second plugin's devices allocatable.
	// Keep checking for a second: the teardown would follow the stream end within milliseconds.
	stopFirst()
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(50 * time.Millisecond) {
		if err := d.waitForResource(resource, inventoryTimeout, counts(2, 2)); err != nil {
			t.Fatalf("%s after the replaced plugin died: %v", time.Since(start), err)
		}
	}

	// The current plugin dies: its devices stay counted in capacity but none is allocatable.
	stopSecond()
	if err := d.waitForResource(resource, inventoryTimeout, counts(2, 0)); err != nil {
		t.Fatalf("after the current plugin died: %v", err)
	}
}

// TestRestartCleansSocketsAndPluginReRegisters follows spec §1.7: on SIGTERM devicelet removes
// kubelet.sock; on start it removes every socket in the device-plugin directory (so plugins see
// kubelet.sock re-created and register again on a fresh socket); after the plugin re-registers
// the inventory is back.
func TestRestartCleansSocketsAndPluginReRegisters(t *testing.T) {
	d := startDevicelet(t)
	v := variantByID(t, "b")
	const resource = "interop.devicelet.invalid/restart"
	pluginSock := filepath.Join(d.pluginDir(), "restart.sock")
	_, stopPlugin := startGoPluginWith(t, pluginSock, interopDevices())
	if err := register(t, v, d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "restart.sock", ResourceName: resource,
	}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatal(err)
	}

	d.stop(t)
	if _, err := os.Lstat(d.kubeletSocket()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubelet.sock still present after SIGTERM (stat error %v)", err)
	}
	// The plugin process is still running and listening when devicelet comes back.
	restarted := startDeviceletAt(t, d.root)
	if _, err := os.Lstat(pluginSock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale plugin socket %s survived the restart's cleanup (stat error %v)", pluginSock, err)
	}
	// Before the plugin comes back nothing of the resource may be allocatable.
	if list, err := restarted.getResources(); err != nil {
		t.Fatal(err)
	} else if r, found := list.findResource(resource); found {
		if n, err := quantity(r.Allocatable); err != nil || n != 0 {
			t.Errorf("before re-registration %s is allocatable: %+v", resource, r)
		}
	}

	// What a stub-based plugin does on kubelet.sock re-creation: a new server, Register again.
	stopPlugin()
	startGoPluginWith(t, pluginSock, interopDevices())
	if err := register(t, v, restarted.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "restart.sock", ResourceName: resource,
	}); err != nil {
		t.Fatalf("Register after restart: %v", err)
	}
	if err := restarted.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatalf("inventory after re-registration: %v", err)
	}
}

// TestListAndWatchSnapshotReplacesInventory follows spec §1.9 and §1.3: every ListAndWatch
// message is a full snapshot (a device missing from it is gone), and any health other than the
// exact string "Healthy" counts as unhealthy.
func TestListAndWatchSnapshotReplacesInventory(t *testing.T) {
	d := startDevicelet(t)
	const resource = "interop.devicelet.invalid/snapshot"
	plugin, _ := startGoPluginWith(t, filepath.Join(d.pluginDir(), "snapshot.sock"), interopDevices())
	if err := register(t, variantByID(t, "b"), d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "snapshot.sock", ResourceName: resource,
	}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatal(err)
	}

	next := []*pluginapi.Device{
		{ID: "dev-0", Health: "healthy"}, // lower case: not "Healthy", so unhealthy
		{ID: "dev-1", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
		{ID: "dev-2", Health: pluginapi.Unhealthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		// dev-3 is gone.
	}
	select {
	case plugin.updates <- next:
	case <-time.After(inventoryTimeout):
		t.Fatal("no open ListAndWatch stream took the second snapshot")
	}
	err := d.waitForResource(resource, inventoryTimeout, func(r resourceEntry) error {
		if err := counts(3, 1)(r); err != nil {
			return err
		}
		for _, dev := range r.Devices {
			if dev.ID == "dev-3" {
				return fmt.Errorf("dev-3 is still listed after a snapshot without it: %+v", r.Devices)
			}
			if dev.ID == "dev-0" && dev.Health == pluginapi.Healthy {
				return fmt.Errorf("dev-0 with health %q is reported Healthy", "healthy")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after the second snapshot: %v", err)
	}
}
