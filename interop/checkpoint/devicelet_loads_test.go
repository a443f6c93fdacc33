package checkpoint

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"
)

const (
	fpga  = "example.com/fpga"
	spare = "example.com/spare"
	// nodeWithoutTopology is the kubelet's NUMA ID for devices without topology
	// (pkg/kubelet/cm/devicemanager/manager.go).
	nodeWithoutTopology = -1
)

type kubeletEntry struct {
	pod, container, resource string
	devices                  checkpoint.DevicesPerNUMA
	resp                     *pluginapi.ContainerAllocateResponse
}

// kubeletEntries is what a kubelet with three pods would checkpoint: several containers and
// resources per pod, devices on NUMA nodes 0 and 1, on both (listed under each, as the kubelet
// does), without topology (-1), a device ID with characters encoding/json escapes, and cached
// answers with envs, mounts, device nodes, annotations and CDI devices, and one empty answer.
func kubeletEntries() []kubeletEntry {
	const (
		pod1 = "5d9c1f8e-0000-4000-8000-000000000001"
		pod2 = "5d9c1f8e-0000-4000-8000-000000000002"
		pod3 = "5d9c1f8e-0000-4000-8000-000000000003"
	)
	return []kubeletEntry{
		{pod1, "init-gpu", gpu, checkpoint.DevicesPerNUMA{0: {"gpu-0"}}, &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{"GPU_VISIBLE_DEVICES": "gpu-0"},
			Devices:    []*pluginapi.DeviceSpec{{ContainerPath: "/dev/gpu0", HostPath: "/dev/gpu0", Permissions: "rw"}},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "vendor.com/gpu=gpu-0"}},
		}},
		{pod1, "app", gpu, checkpoint.DevicesPerNUMA{0: {"gpu-0"}, 1: {"gpu-2"}}, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"GPU_VISIBLE_DEVICES": "gpu-0,gpu-2", "GPU_MODE": "a<b>&c d=e"},
			Mounts: []*pluginapi.Mount{
				{ContainerPath: "/usr/local/gpu", HostPath: "/opt/gpu/lib", ReadOnly: true},
			},
			Devices: []*pluginapi.DeviceSpec{
				{ContainerPath: "/dev/gpu0", HostPath: "/dev/gpu0", Permissions: "rw"},
				{ContainerPath: "/dev/gpu2", HostPath: "/dev/nvidia2", Permissions: "r"},
			},
			Annotations: map[string]string{"vendor.com/gpu-ids": "gpu-0,gpu-2"},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "vendor.com/gpu=gpu-0"}, {Name: "vendor.com/gpu=gpu-2"}},
		}},
		{pod1, "app", nic, checkpoint.DevicesPerNUMA{nodeWithoutTopology: {"nic-a"}}, &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{"NIC_IFACE": "eth1"},
			Mounts:      []*pluginapi.Mount{{ContainerPath: "/etc/nic", HostPath: "/var/run/nic/a"}},
			Annotations: map[string]string{"vendor.com/nic": "nic-a"},
		}},
		{pod2, "main", gpu, checkpoint.DevicesPerNUMA{0: {"gpu-x"}, 1: {"gpu-x"}}, &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{"GPU_VISIBLE_DEVICES": "gpu-x"},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "vendor.com/gpu=gpu-x"}},
		}},
		{pod2, "main", fpga, checkpoint.DevicesPerNUMA{1: {"fpga<0>&1", "fpga-2"}}, &pluginapi.ContainerAllocateResponse{
			Envs:    map[string]string{"FPGA_SLOTS": "0,2"},
			Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/fpga0", HostPath: "/dev/fpga0", Permissions: "rwm"}},
		}},
		{pod3, "sidecar", nic, checkpoint.DevicesPerNUMA{nodeWithoutTopology: {"nic-b"}}, &pluginapi.ContainerAllocateResponse{}},
	}
}

var kubeletRegistered = map[string][]string{
	gpu:   {"gpu-0", "gpu-1", "gpu-2", "gpu-x"},
	nic:   {"nic-a", "nic-b"},
	fpga:  {"fpga<0>&1", "fpga-2"},
	spare: {},
}

// TestDeviceletLoadsKubeletCheckpoint: the kubelet's own code writes a device checkpoint
// (CreateCheckpoint: checksum, JSON, atomic write); `devicelet state inspect` verifies it and
// shows the same entries; `devicelet state import` takes it over, and `devicelet serve` on that
// root reports the pods' devices and answers `start` from the cached answers with no plugin
// running. After a clean stop the kubelet's code loads devicelet's rewrite with the same data.
func TestDeviceletLoadsKubeletCheckpoint(t *testing.T) {
	want := kubeletEntries()
	var entries []checkpoint.PodDevicesEntry
	for _, e := range want {
		raw, err := proto.Marshal(e.resp)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, checkpoint.PodDevicesEntry{
			PodUID: e.pod, ContainerName: e.container, ResourceName: e.resource,
			DeviceIDs: e.devices, AllocResp: raw,
		})
	}
	work := newRoot(t)
	src := filepath.Join(work, "src")
	manager, err := checkpointmanager.NewCheckpointManager(src)
	if err != nil {
		t.Fatal(err)
	}
	written := checkpoint.New(entries, kubeletRegistered)
	if err := manager.CreateCheckpoint(checkpointFile, written); err != nil {
		t.Fatalf("the kubelet's CreateCheckpoint: %v", err)
	}
	checksum := uint64(written.(*checkpoint.Data).Checksum)
	file := filepath.Join(src, checkpointFile)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the kubelet wrote %s (%d bytes, checksum %d):\n%s", file, len(raw), checksum, raw)

	// state inspect: verified, and entry for entry what the kubelet wrote, in its order.
	view := inspect(t, work, file)
	if view.Checksum.Stored != checksum {
		t.Errorf("state inspect: stored checksum %d, the kubelet wrote %d", view.Checksum.Stored, checksum)
	}
	if len(view.Body.Entries) != len(entries) {
		t.Fatalf("state inspect shows %d entries, the kubelet wrote %d: %+v", len(view.Body.Entries), len(entries), view.Body)
	}
	for i, e := range entries {
		v := view.Body.Entries[i]
		if v.PodUID != e.PodUID || v.Container != e.ContainerName || v.Resource != e.ResourceName ||
			v.AllocRespBytes != len(e.AllocResp) || !equalNUMA(v.DevicesByNUMA, numaKeys(e.DeviceIDs)) {
			t.Errorf("state inspect entry %d = %+v, the kubelet wrote %+v", i, v, e)
		}
	}
	if !equalNUMA(view.Body.Registered, kubeletRegistered) {
		t.Errorf("state inspect registered = %v, the kubelet wrote %v", view.Body.Registered, kubeletRegistered)
	}

	// state import into a fresh root, then serve with no plugin.
	root := filepath.Join(work, "r")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := cli(t, root, "state", "import", "--file", file); err != nil {
		t.Fatalf("devicelet state import: %v\n%s\n%s", err, out, errOut)
	}
	daemon := serve(t, root)

	wantDevices := map[containerKey]map[string][]string{}
	wantResps := map[containerKey][]*pluginapi.ContainerAllocateResponse{}
	for _, e := range want {
		ck := containerKey{e.pod, e.container}
		if wantDevices[ck] == nil {
			wantDevices[ck] = map[string][]string{}
		}
		wantDevices[ck][e.resource] = devicesOf(e.devices)
		wantResps[ck] = append(wantResps[ck], e.resp)
	}
	var pods podsOutput
	cliJSON(t, root, &pods, "get", "pods", "-o", "json")
	got := map[containerKey]map[string][]string{}
	for _, p := range pods.Pods {
		for _, c := range p.Containers {
			devs := map[string][]string{}
			for res, ids := range c.Devices {
				if len(ids) > 0 {
					devs[res] = sortedUnique(ids)
				}
			}
			if len(devs) > 0 {
				got[containerKey{p.Pod.UID, c.Name}] = devs
			}
		}
	}
	if !maps.EqualFunc(got, wantDevices, func(a, b map[string][]string) bool { return equalNUMA(a, b) }) {
		t.Errorf("devicelet get pods after import:\n got  %v\n want %v (the kubelet's entries)", got, wantDevices)
	}

	// Every container's runtime settings come from its cached answers (no plugin runs).
	for ck, resps := range wantResps {
		var s startOutput
		cliJSON(t, root, &s, "start", ck.pod, ck.container, "-o", "json")
		checkStart(t, ck.pod+"/"+ck.container, s, resps)
	}

	// Every RegisteredDevices key is a registered resource with nothing allocatable until its
	// plugin comes back (spec devicemanager.md §3.4).
	var resources resourcesOutput
	cliJSON(t, root, &resources, "get", "resources", "-o", "json")
	byName := map[string]resourceView{}
	for _, r := range resources.Resources {
		byName[r.Name] = r
	}
	if !slices.Equal(keys(byName), keys(kubeletRegistered)) {
		t.Errorf("get resources after import lists %v, RegisteredDevices has %v", keys(byName), keys(kubeletRegistered))
	}
	for name, r := range byName {
		if r.Capacity != 0 || r.Allocatable != 0 {
			t.Errorf("resource %s restored with capacity %d, allocatable %d; want 0/0 until its plugin registers", name, r.Capacity, r.Allocatable)
		}
	}

	// A clean stop writes devicelet's own kubelet-format file; the kubelet's code reads the same
	// pods back (registered resources keep their keys; only keys are used on read).
	daemon.terminate(t)
	_, back, registered, resps := loadWithKubelet(t, filepath.Join(root, "device-plugins"))
	wantByKey := map[entryKey]kubeletEntry{}
	for _, e := range want {
		wantByKey[entryKey{e.pod, e.container, e.resource}] = e
	}
	if len(back) != len(want) {
		t.Errorf("the kubelet reads %d entries back from devicelet, want %d", len(back), len(want))
	}
	for i, e := range back {
		key := entryKey{e.PodUID, e.ContainerName, e.ResourceName}
		w, ok := wantByKey[key]
		if !ok {
			t.Errorf("entry %s read back is not one the kubelet wrote", key)
			continue
		}
		delete(wantByKey, key)
		if !equalNUMA(numaKeys(e.DeviceIDs), numaKeys(w.devices)) {
			t.Errorf("entry %s read back: devices %v, the kubelet wrote %v", key, e.DeviceIDs, w.devices)
		}
		if !proto.Equal(resps[i], w.resp) {
			t.Errorf("entry %s read back: answer %v, the kubelet wrote %v", key, resps[i], w.resp)
		}
	}
	for key := range wantByKey {
		t.Errorf("entry %s is lost after import, serve and stop", key)
	}
	if !slices.Equal(keys(registered), keys(kubeletRegistered)) {
		t.Errorf("RegisteredDevices read back has %v, the kubelet wrote %v", keys(registered), keys(kubeletRegistered))
	}
}

// TestDeviceletInspectsEmptyKubeletCheckpoint: a kubelet with no allocations and no plugins
// writes null for both lists (checkpoint.New(nil, nil)); devicelet verifies that checksum too.
func TestDeviceletInspectsEmptyKubeletCheckpoint(t *testing.T) {
	work := newRoot(t)
	manager, err := checkpointmanager.NewCheckpointManager(work)
	if err != nil {
		t.Fatal(err)
	}
	written := checkpoint.New(nil, nil)
	if err := manager.CreateCheckpoint(checkpointFile, written); err != nil {
		t.Fatalf("the kubelet's CreateCheckpoint: %v", err)
	}
	view := inspect(t, work, filepath.Join(work, checkpointFile))
	if view.Checksum.Stored != uint64(written.(*checkpoint.Data).Checksum) {
		t.Errorf("state inspect: stored checksum %d, the kubelet wrote %d", view.Checksum.Stored, written.(*checkpoint.Data).Checksum)
	}
	if len(view.Body.Entries) != 0 || len(view.Body.Registered) != 0 {
		t.Errorf("state inspect of an empty checkpoint: %+v", view.Body)
	}
}
