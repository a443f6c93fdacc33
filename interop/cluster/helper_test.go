package cluster

// A driver written directly on the upstream kubelet-plugin helper
// (k8s.io/dynamic-resource-allocation/kubeletplugin), as nearly every DRA driver is, with a real
// clientset under the node's identity: the helper registers through devicelet's plugin watcher,
// publishes its ResourceSlice to the API server, reads each claim from the API server in
// NodePrepareResources (the kubelet's request carries only namespace, name and UID) and hands it
// to the driver; devicelet gives the container the driver's CDI IDs and unprepares the claim when
// the pod goes. Once with the helper serving DRA v1 and once v1beta1 only (devicelet must pick
// the service the driver offers).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

const helperDriver = "helper.interop.example.com"

// helperDriverPlugin records the claims it is asked to prepare and unprepare and returns one
// CDI ID per allocated device.
type helperDriverPlugin struct {
	mu         sync.Mutex
	prepared   []*resourceapi.ResourceClaim
	unprepared []types.UID
}

func (d *helperDriverPlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		d.prepared = append(d.prepared, c)
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != helperDriver {
				continue
			}
			devs = append(devs, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{fmt.Sprintf("%s/test=claim-%s-%s", helperDriver, c.UID, r.Device)},
			})
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (d *helperDriverPlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		d.unprepared = append(d.unprepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func (d *helperDriverPlugin) HandleError(ctx context.Context, err error, msg string) {}

func TestKubeletPluginHelperDriver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v1      bool
		service string
	}{{"v1", true, "v1.DRAPlugin"}, {"v1beta1-only", false, "v1beta1.DRAPlugin"}} {
		t.Run(tc.name, func(t *testing.T) { runHelperDriver(t, "helper-"+tc.name, tc.v1, tc.service) })
	}
}

func runHelperDriver(t *testing.T, name string, v1 bool, wantService string) {
	n := startNode(t, name)
	dataDir := filepath.Join(n.root, "plugins", helperDriver)
	// A DaemonSet would mount this hostPath with DirectoryOrCreate.
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drv := &helperDriverPlugin{}
	helper, err := kubeletplugin.Start(runCtx, drv,
		kubeletplugin.DriverName(helperDriver),
		kubeletplugin.KubeClient(nodeClient(t, n)),
		kubeletplugin.NodeName(n.name),
		kubeletplugin.NodeV1(v1),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(n.root, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		n.name: {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "dev-0"}, {Name: "dev-1"}}}}},
	}}
	if err := helper.PublishResources(runCtx, resources); err != nil {
		t.Fatalf("publish ResourceSlices: %v", err)
	}
	waitFor(t, 60*time.Second, "registration acknowledged by devicelet", func() (bool, string) {
		st := helper.RegistrationStatus()
		return st != nil && st.PluginRegistered, fmt.Sprintf("%+v", st)
	})
	var state struct {
		Drivers []struct {
			Driver  string `json:"driver"`
			Service string `json:"service"`
		} `json:"drivers"`
	}
	if err := json.Unmarshal([]byte(n.cli(t, "get", "dra", "-o", "json")), &state); err != nil {
		t.Fatal(err)
	}
	if len(state.Drivers) != 1 || state.Drivers[0].Service != wantService {
		t.Fatalf("devicelet's DRA drivers = %+v, want %s", state.Drivers, wantService)
	}

	ns := namespace(t, name)
	class := "helper-" + name
	driverClass(t, class, helperDriver)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "interop-claim", Namespace: ns}, Spec: claimSpec(class)}
	created, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Create(ctx(t), claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claimPod(t, ns, "consumer", n.name, "", "interop-claim")
	pod := waitForPodRunning(t, ns, "consumer")

	drv.mu.Lock()
	prepared := slices.Clone(drv.prepared)
	drv.mu.Unlock()
	// The helper fetched the claim from the API server: it is the allocated, reserved object.
	if len(prepared) != 1 || prepared[0].UID != created.UID || prepared[0].Status.Allocation == nil ||
		len(prepared[0].Status.ReservedFor) != 1 || prepared[0].Status.ReservedFor[0].UID != pod.UID {
		t.Fatalf("driver prepared %+v, want claim %s allocated and reserved for %s", prepared, created.UID, pod.UID)
	}
	device := prepared[0].Status.Allocation.Devices.Results[0].Device
	want := fmt.Sprintf("%s/test=claim-%s-%s", helperDriver, created.UID, device)
	if got := cdiDevices(t, n, string(pod.UID)); len(got) != 1 || got[0] != want {
		t.Fatalf("devicelet start cdiDevices = %v, want [%s]", got, want)
	}

	deletePodAndWait(t, ns, "consumer")
	drv.mu.Lock()
	defer drv.mu.Unlock()
	if len(drv.unprepared) != 1 || drv.unprepared[0] != created.UID {
		t.Fatalf("driver unprepared %v, want [%s]", drv.unprepared, created.UID)
	}
}
