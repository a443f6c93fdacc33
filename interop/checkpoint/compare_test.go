package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"
)

// loadWithKubelet reads dir/kubelet_internal_checkpoint the way the kubelet's Device Manager
// does at start (readCheckpoint): checkpointmanager.GetCheckpoint into checkpoint.New(nil, nil),
// which unmarshals the JSON and verifies the checksum, then proto.Unmarshal of every cached
// answer into a v1beta1 ContainerAllocateResponse (podDevices.fromCheckpointData). Any error
// fails the test.
func loadWithKubelet(t *testing.T, dir string) (*checkpoint.Data, []checkpoint.PodDevicesEntry, map[string][]string, []*pluginapi.ContainerAllocateResponse) {
	t.Helper()
	data, entries, registered, resps, err := readWithKubelet(dir)
	if err != nil {
		raw, _ := os.ReadFile(filepath.Join(dir, checkpointFile))
		t.Fatalf("%v\nfile:\n%s", err, raw)
	}
	return data, entries, registered, resps
}

// readWithKubelet is loadWithKubelet returning the error.
func readWithKubelet(dir string) (*checkpoint.Data, []checkpoint.PodDevicesEntry, map[string][]string, []*pluginapi.ContainerAllocateResponse, error) {
	manager, err := checkpointmanager.NewCheckpointManager(dir)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("kubelet checkpointmanager.NewCheckpointManager(%s): %w", dir, err)
	}
	cp := checkpoint.New(nil, nil)
	if err := manager.GetCheckpoint(checkpointFile, cp); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("the kubelet's GetCheckpoint rejects %s: %w", filepath.Join(dir, checkpointFile), err)
	}
	data, ok := cp.(*checkpoint.Data)
	if !ok {
		return nil, nil, nil, nil, fmt.Errorf("checkpoint.New returned %T, not *checkpoint.Data", cp)
	}
	entries, registered := cp.GetData()
	var resps []*pluginapi.ContainerAllocateResponse
	for _, e := range entries {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("entry %s/%s/%s: the kubelet cannot decode AllocResp (%d bytes) as ContainerAllocateResponse: %w",
				e.PodUID, e.ContainerName, e.ResourceName, len(e.AllocResp), err)
		}
		resps = append(resps, resp)
	}
	return data, entries, registered, resps, nil
}

// entryKey names one checkpoint entry: pod UID, container, resource.
type entryKey struct{ pod, container, resource string }

func (k entryKey) String() string { return k.pod + "/" + k.container + "/" + k.resource }

type containerKey struct{ pod, container string }

// devicesOf lists the device IDs of a DevicesPerNUMA, sorted and without duplicates (a device
// on several NUMA nodes is listed under each of them).
func devicesOf(d checkpoint.DevicesPerNUMA) []string {
	return sortedUnique(d.Devices().UnsortedList())
}

func sortedUnique(ids []string) []string {
	out := slices.Clone(ids)
	sort.Strings(out)
	return slices.Compact(out)
}

// numaKeys is d with its NUMA IDs written as the decimal strings devicelet's JSON uses.
func numaKeys(d checkpoint.DevicesPerNUMA) map[string][]string {
	if d == nil {
		return nil
	}
	out := make(map[string][]string, len(d))
	for node, ids := range d {
		out[strconv.FormatInt(node, 10)] = ids
	}
	return out
}

// checkStart compares `devicelet start` for one container with the runtime settings the
// kubelet derives from the container's cached answers (podDevices.deviceRunContainerOptions):
// envs and annotations merged by key, devices and mounts by container path, CDI devices as a
// set. When two resources set the same key differently the kubelet keeps whichever its map
// iteration meets first, so either value is accepted.
func checkStart(t *testing.T, what string, got startOutput, resps []*pluginapi.ContainerAllocateResponse) {
	t.Helper()
	envs := map[string][]string{}
	annotations := map[string][]string{}
	devices := map[string][]string{}
	mounts := map[string][]string{}
	cdi := map[string]bool{}
	for _, r := range resps {
		for k, v := range r.Envs {
			envs[k] = append(envs[k], v)
		}
		for k, v := range r.Annotations {
			annotations[k] = append(annotations[k], v)
		}
		for _, d := range r.Devices {
			devices[d.ContainerPath] = append(devices[d.ContainerPath], d.HostPath+" "+d.Permissions)
		}
		for _, m := range r.Mounts {
			mounts[m.ContainerPath] = append(mounts[m.ContainerPath], fmt.Sprintf("%s ro=%t", m.HostPath, m.ReadOnly))
		}
		for _, c := range r.CdiDevices {
			cdi[c.Name] = true
		}
	}
	gotDevices := map[string]string{}
	for _, d := range got.Devices {
		if _, dup := gotDevices[d.ContainerPath]; dup {
			t.Errorf("%s: start lists device %s twice", what, d.ContainerPath)
		}
		gotDevices[d.ContainerPath] = d.HostPath + " " + d.Permissions
	}
	gotMounts := map[string]string{}
	for _, m := range got.Mounts {
		if _, dup := gotMounts[m.ContainerPath]; dup {
			t.Errorf("%s: start lists mount %s twice", what, m.ContainerPath)
		}
		gotMounts[m.ContainerPath] = fmt.Sprintf("%s ro=%t", m.HostPath, m.ReadOnly)
	}
	gotCDI := map[string]bool{}
	for _, c := range got.CDIDevices {
		if gotCDI[c] {
			t.Errorf("%s: start lists CDI device %s twice", what, c)
		}
		gotCDI[c] = true
	}
	matchMerged(t, what+" envs", got.Envs, envs)
	matchMerged(t, what+" annotations", got.Annotations, annotations)
	matchMerged(t, what+" devices", gotDevices, devices)
	matchMerged(t, what+" mounts", gotMounts, mounts)
	if want := keys(cdi); !slices.Equal(keys(gotCDI), want) {
		t.Errorf("%s cdiDevices: start says %v, the cached answers say %v", what, keys(gotCDI), want)
	}
}

func matchMerged(t *testing.T, what string, got map[string]string, want map[string][]string) {
	t.Helper()
	if !slices.Equal(keys(got), keys(want)) {
		t.Errorf("%s: start has keys %v, the cached answers have %v (start: %v, answers: %v)", what, keys(got), keys(want), got, want)
		return
	}
	for k, v := range got {
		if !slices.Contains(want[k], v) {
			t.Errorf("%s[%s]: start says %q, the cached answers say %q", what, k, v, want[k])
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
