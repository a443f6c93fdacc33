package checkpoint

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

const (
	gpu = "example.com/gpu"
	nic = "example.com/nic"
)

// Two pods: init-container reuse (warmup's GPU goes on to trainer), a restartable init
// container (sidecar) that keeps its own NIC, a container with two resources, a container
// with none.
var deviceletPods = map[string]string{
	"0a1b2c3d-0000-4000-8000-00000000000a": `apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: team-a
  uid: 0a1b2c3d-0000-4000-8000-00000000000a
spec:
  initContainers:
    - name: warmup
      resources:
        limits:
          example.com/gpu: "1"
    - name: log-shipper
      restartPolicy: Always
      resources:
        limits:
          example.com/nic: "1"
  containers:
    - name: trainer
      resources:
        limits:
          example.com/gpu: "2"
          example.com/nic: "1"
    - name: helper
      resources:
        limits:
          cpu: 100m
`,
	"0a1b2c3d-0000-4000-8000-00000000000b": `apiVersion: v1
kind: Pod
metadata:
  name: infer
  namespace: team-b
  uid: 0a1b2c3d-0000-4000-8000-00000000000b
spec:
  containers:
    - name: main
      resources:
        limits:
          example.com/gpu: "1"
    - name: aux
      resources:
        limits:
          example.com/nic: "1"
`,
}

// TestKubeletLoadsDeviceletCheckpoint: devicelet admits pods with devices from its example
// plugins (GPUs on two NUMA nodes, one of them unhealthy; NICs without topology), stops
// cleanly, and the kubelet's own checkpoint code loads R/device-plugins/kubelet_internal_checkpoint
// (checksum verified) with exactly what devicelet reported while running.
func TestKubeletLoadsDeviceletCheckpoint(t *testing.T) {
	root := newRoot(t)
	daemon := serve(t, root)
	gpuPlugin := examplePlugin(t, root, "--resource", gpu, "--devices", "4", "--numa-nodes", "2", "--unhealthy", "gpu-3")
	nicPlugin := examplePlugin(t, root, "--resource", nic, "--devices", "3", "--numa-nodes", "0")
	var resources resourcesOutput
	waitFor(t, daemon, "both example plugins' devices", func() bool {
		resources = resourcesOutput{}
		cliJSON(t, root, &resources, "get", "resources", "-o", "json")
		counts := map[string][2]int{}
		for _, r := range resources.Resources {
			counts[r.Name] = [2]int{r.Capacity, r.Allocatable}
		}
		return counts[gpu] == [2]int{4, 3} && counts[nic] == [2]int{3, 3}
	})

	for uid, manifest := range deviceletPods {
		file := filepath.Join(root, uid+".yaml")
		if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, errOut, err := cli(t, root, "admit", "-f", file, "-o", "json"); err != nil {
			t.Fatalf("devicelet admit %s: %v\n%s\n%s", uid, err, out, errOut)
		}
	}

	// What devicelet says while running: allocations, the inventory, runtime settings.
	var pods podsOutput
	cliJSON(t, root, &pods, "get", "pods", "-o", "json")
	cliJSON(t, root, &resources, "get", "resources", "-o", "json")
	wantDevices := map[entryKey][]string{}
	starts := map[containerKey]startOutput{}
	for _, p := range pods.Pods {
		for _, c := range p.Containers {
			for res, ids := range c.Devices {
				if len(ids) > 0 {
					wantDevices[entryKey{p.Pod.UID, c.Name, res}] = ids
				}
			}
			if len(c.Devices) > 0 {
				var s startOutput
				cliJSON(t, root, &s, "start", p.Pod.UID, c.Name, "-o", "json")
				starts[containerKey{p.Pod.UID, c.Name}] = s
			}
		}
	}
	// The test must see what it set up: 6 allocations in 5 containers of two pods (warmup,
	// log-shipper, trainer with both resources, main, aux).
	if len(wantDevices) != 6 {
		t.Fatalf("devicelet get pods shows %d (pod, container, resource) allocations, want 6: %+v", len(wantDevices), pods)
	}
	numa := map[string]map[string][]int64{} // resource -> device -> NUMA nodes
	healthy := map[string][]string{}
	for _, r := range resources.Resources {
		numa[r.Name] = map[string][]int64{}
		healthy[r.Name] = []string{}
		for _, d := range r.Devices {
			numa[r.Name][d.ID] = d.NUMANodes
			if d.Health == "Healthy" {
				healthy[r.Name] = append(healthy[r.Name], d.ID)
			}
		}
	}

	dir := filepath.Join(root, "device-plugins")

	// While devicelet runs, its file trails the journal by about a second (compaction,
	// docs/durable-state.md). A kubelet restarting now would read every allocation and, in
	// RegisteredDevices, exactly the healthy devices of each resource.
	var live map[string][]string
	waitForState(t, daemon, "the running daemon's kubelet_internal_checkpoint to hold the 6 allocations and the healthy devices", func() (bool, string) {
		_, entries, registered, _, err := readWithKubelet(dir)
		live = registered
		if err != nil {
			return false, err.Error()
		}
		last := fmt.Sprintf("%d entries, RegisteredDevices %v (healthy: %v)", len(entries), registered, healthy)
		return len(entries) == len(wantDevices) && equalNUMA(sortedValues(registered), sortedValues(healthy)), last
	})
	t.Logf("while running, the kubelet reads RegisteredDevices %v from devicelet's file", live)

	// A clean stop folds the journal into the kubelet-format file. The daemon stops first,
	// while its plugins still serve.
	daemon.terminate(t)
	gpuPlugin.terminate(t)
	nicPlugin.terminate(t)

	data, entries, registered, resps := loadWithKubelet(t, dir)
	raw, err := os.ReadFile(filepath.Join(dir, checkpointFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("devicelet's %s (%d bytes), loaded by the kubelet's checkpointmanager: %d entries, checksum %d",
		checkpointFile, len(raw), len(entries), data.Checksum)

	seen := map[entryKey]bool{}
	perContainer := map[containerKey][]int{}
	for i, e := range entries {
		key := entryKey{e.PodUID, e.ContainerName, e.ResourceName}
		if seen[key] {
			t.Errorf("entry %s appears twice", key)
		}
		seen[key] = true
		perContainer[containerKey{e.PodUID, e.ContainerName}] = append(perContainer[containerKey{e.PodUID, e.ContainerName}], i)
		want, ok := wantDevices[key]
		if !ok {
			t.Errorf("entry %s is not an allocation devicelet reported (get pods: %v)", key, wantDevices)
			continue
		}
		if got := devicesOf(e.DeviceIDs); !slices.Equal(got, sortedUnique(want)) {
			t.Errorf("entry %s: devices %v, devicelet get pods said %v", key, got, want)
		}
		// Per NUMA node as the kubelet files them (manager.go allocateContainerResources): a
		// device under each of its NUMA nodes, -1 (nodeWithoutTopology) when it has none.
		for _, id := range want {
			nodes := numa[e.ResourceName][id]
			if len(nodes) == 0 {
				nodes = []int64{-1}
			}
			for _, n := range nodes {
				if !slices.Contains(e.DeviceIDs[n], id) {
					t.Errorf("entry %s: device %s (NUMA nodes %v in get resources) is not under NUMA node %d: %v",
						key, id, numa[e.ResourceName][id], n, e.DeviceIDs)
				}
			}
		}
		for n, ids := range e.DeviceIDs {
			for _, id := range ids {
				nodes := numa[e.ResourceName][id]
				if !(n == -1 && len(nodes) == 0) && !slices.Contains(nodes, n) {
					t.Errorf("entry %s: device %s under NUMA node %d, but get resources gives it %v", key, id, n, nodes)
				}
			}
		}
		// The cached answer belongs to this entry: the example plugin names every allocated
		// device as the CDI device "<resource>=<id>" (crates/devicelet/src/example_plugin).
		var cdi []string
		for _, c := range resps[i].CdiDevices {
			cdi = append(cdi, c.Name)
		}
		var wantCDI []string
		for _, id := range want {
			wantCDI = append(wantCDI, e.ResourceName+"="+id)
		}
		if !slices.Equal(sortedUnique(cdi), sortedUnique(wantCDI)) {
			t.Errorf("entry %s: the cached answer's CDI devices are %v, want %v (answer: %v)", key, cdi, wantCDI, resps[i])
		}
		if len(resps[i].Envs) == 0 {
			t.Errorf("entry %s: the cached answer has no envs: %v", key, resps[i])
		}
	}
	for key := range wantDevices {
		if !seen[key] {
			t.Errorf("allocation %s (devices %v) has no checkpoint entry", key, wantDevices[key])
		}
	}

	// The runtime settings the kubelet would derive from the restored answers are the ones
	// devicelet's `start` printed.
	if len(perContainer) != len(starts) {
		t.Errorf("entries cover %d containers, devicelet answered start for %d", len(perContainer), len(starts))
	}
	for ck, idx := range perContainer {
		got, ok := starts[ck]
		if !ok {
			t.Errorf("no start output for %s/%s", ck.pod, ck.container)
			continue
		}
		var list = resps[:0:0]
		for _, i := range idx {
			list = append(list, resps[i])
		}
		checkStart(t, ck.pod+"/"+ck.container, got, list)
	}

	// RegisteredDevices: every resource (the only part the kubelet uses on read), with the
	// healthy devices (not gpu-3) as last seen while running. Stopping disconnects the plugins,
	// which empties their device lists; the kubelet writes nothing at stop and devicelet does
	// not record that emptying either (Daemon::shutdown signals its tasks first).
	if !slices.Equal(keys(registered), keys(healthy)) {
		t.Errorf("RegisteredDevices has resources %v, get resources %v", keys(registered), keys(healthy))
	}
	for res, ids := range healthy {
		if got := sortedUnique(registered[res]); !slices.Equal(got, sortedUnique(ids)) {
			t.Errorf("RegisteredDevices[%s] = %v, healthy devices in get resources: %v", res, registered[res], ids)
		}
	}
	if len(live[gpu]) != 3 || slices.Contains(live[gpu], "gpu-3") || len(live[nic]) != 3 {
		t.Errorf("RegisteredDevices while running = %v, want 3 healthy GPUs (not gpu-3) and 3 NICs", live)
	}
	t.Logf("after the stop, the kubelet reads RegisteredDevices %v", registered)

	// devicelet reads its own file the same way (state inspect), entry for entry, checksum too.
	view := inspect(t, root, filepath.Join(dir, checkpointFile))
	if view.Checksum.Stored != uint64(data.Checksum) {
		t.Errorf("state inspect: stored checksum %d, the kubelet read %d", view.Checksum.Stored, data.Checksum)
	}
	if len(view.Body.Entries) != len(entries) {
		t.Fatalf("state inspect shows %d entries, the kubelet %d", len(view.Body.Entries), len(entries))
	}
	for i, e := range entries {
		v := view.Body.Entries[i]
		if v.PodUID != e.PodUID || v.Container != e.ContainerName || v.Resource != e.ResourceName ||
			v.AllocRespBytes != len(e.AllocResp) || !equalNUMA(v.DevicesByNUMA, numaKeys(e.DeviceIDs)) {
			t.Errorf("state inspect entry %d = %+v, the kubelet read %+v", i, v, e)
		}
	}
	if !equalNUMA(view.Body.Registered, registered) {
		t.Errorf("state inspect registered = %v, the kubelet read %v", view.Body.Registered, registered)
	}

	// What the kubelet writes for the data it read (MarshalCheckpoint: checksum.New, then
	// encoding/json) is devicelet's file byte for byte.
	again, err := data.MarshalCheckpoint()
	if err != nil {
		t.Fatalf("the kubelet's MarshalCheckpoint: %v", err)
	}
	if !bytes.Equal(again, raw) {
		t.Errorf("the kubelet re-encodes the data differently:\ndevicelet: %s\nkubelet:   %s", raw, again)
	}
}

// sortedValues is m with each list sorted and without duplicates.
func sortedValues(m map[string][]string) map[string][]string {
	out := make(map[string][]string, len(m))
	for k, v := range m {
		out[k] = sortedUnique(v)
	}
	return out
}

// equalNUMA compares two string-keyed lists (order within a list matters).
func equalNUMA(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}
