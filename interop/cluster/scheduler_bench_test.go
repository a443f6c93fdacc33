package cluster

// Issue 25's benchmark: scheduler_perf's SchedulingWithResourceClaimTemplate (spec §9, S159)
// against the project's control plane, nodes as API objects with one ResourceSlice of 10 devices
// each, pods with one template claim each (kube-controller-manager creates the claims), for three
// deciders in the same run:
//
//   - kube: a kube-scheduler v1.36.3 of its own profile, client QPS/burst 5 000;
//   - devicelet: `devicelet scheduler` (DEVICELET_BIN; use a release build for figures);
//   - devicelet-http1-json: the same binary as it talked to the API server before issue 42
//     (HTTP/1.1, one connection per request in flight, every write JSON), for before/after;
//   - ceiling: a binder that decides nothing (pod i goes to node i/10, device i%10) and writes
//     exactly what a scheduler writes per pod (claim finalizer Update, allocation+reservedFor
//     UpdateStatus, pods/binding, the Scheduled event), 64 writers: the API server's own
//     ceiling for those writes.
//
// Each decider gets its own node set (a label, pods select it by nodeSelector, so every node of
// another set is rejected by NodeAffinity before DRA looks at it) and its own driver. Pods and
// claims exist before the decider starts, so only deciding and writing are timed. As in
// scheduler_perf's 5000pods_500nodes the pods fill the nodes: the first half warms up ("init
// pods"), the rate is taken over the second half, from the watch's view of each binding.
//
// Run with SCHEDULER_BENCH=1 (not part of CI):
//
//	SCHEDULER_BENCH_NODES   nodes per decider (default 500)
//	SCHEDULER_BENCH_PODS    pods per decider (default nodes × 10: the nodes full)
//	SCHEDULER_BENCH_ONLY    comma-separated subset of kube,devicelet,ceiling,devicelet-http1-json
//
// Per decider the API server's own counters give what its writes cost there, per bound pod:
// requests (watches apart), request bytes and the bytes of answers to reads
// (apiserver_request_total, apiserver_request_body_size_bytes, apiserver_response_sizes), read
// before and after.

import (
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

const benchDevicesPerNode = 10

// benchClient is an admin clientset without a client-side rate limit that matters (the control
// plane's own limits are what is measured).
func benchClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(controlPlane.state, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 5000, 5000
	return kubernetes.NewForConfigOrDie(cfg)
}

// parallel runs do(i) for i in [0, n) on `workers` goroutines and returns the first error.
func parallel(n, workers int, do func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || first.Load() != nil {
					return
				}
				if err := do(i); err != nil {
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// benchNodes creates `n` Nodes labelled devicelet.dev/bench=set with one slice of driver each.
func benchNodes(t *testing.T, c kubernetes.Interface, set, driver string, n int) {
	t.Helper()
	res := corev1.ResourceList{"cpu": resource.MustParse("32"), "memory": resource.MustParse("128Gi"), "pods": resource.MustParse("1000")}
	err := parallel(n, 32, func(i int) error {
		name := fmt.Sprintf("%s-%d", set, i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "devicelet.dev/api-only": "true", "devicelet.dev/bench": set,
		}}}
		created, err := c.CoreV1().Nodes().Create(ctx(t), node, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		for attempt := 0; ; attempt++ {
			created.Status.Capacity, created.Status.Allocatable = res, res
			if _, err = c.CoreV1().Nodes().UpdateStatus(ctx(t), created, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) || attempt == 10 {
				break
			}
			if created, err = c.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		if err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		var devs []resourcev1.Device
		for d := 0; d < benchDevicesPerNode; d++ {
			devs = append(devs, gpuDevice(fmt.Sprintf("gpu-%d", d), "a100", int64(d%2)))
		}
		_, err = c.ResourceV1().ResourceSlices().Create(ctx(t), &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-slice"},
			Spec: resourcev1.ResourceSliceSpec{
				Driver: driver, NodeName: ptr.To(name),
				Pool:    resourcev1.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
				Devices: devs,
			},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("bench nodes %s: %v", set, err)
	}
	t.Cleanup(func() {
		_ = parallel(n, 32, func(i int) error {
			name := fmt.Sprintf("%s-%d", set, i)
			_ = c.ResourceV1().ResourceSlices().Delete(ctx(t), name+"-slice", metav1.DeleteOptions{})
			return c.CoreV1().Nodes().Delete(ctx(t), name, metav1.DeleteOptions{})
		})
	})
}

// benchPods creates `n` pods b0.. in ns for `scheduler`, selecting node set `set`, each with the
// template claim "gpu", and waits until kube-controller-manager created every claim.
func benchPods(t *testing.T, c kubernetes.Interface, ns, set, scheduler string, n int) {
	t.Helper()
	createTemplatePods(t, c, ns, "b", scheduler, n, 32, func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"devicelet.dev/bench": set}
		// Nodes without an agent are tainted unreachable by the node lifecycle controller
		// after its grace period; every decider gets the same pods, so the same tolerations.
		s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	})
	waitForPodClaims(t, c, ns, n, 900*time.Second)
}

// bindWatch records, from a watch on ns, when each pod was first seen bound.
type bindWatch struct {
	mu    sync.Mutex
	times []time.Time
	seen  map[string]bool
	at    map[string]time.Time
	done  chan struct{}
	want  int
	stop  func()
}

func watchBinds(t *testing.T, c kubernetes.Interface, ns string, want int) *bindWatch {
	t.Helper()
	b := &bindWatch{seen: map[string]bool{}, at: map[string]time.Time{}, done: make(chan struct{}), want: want}
	// An informer, not a bare watch: it survives the API server closing the stream.
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.seen[p.Name] {
			b.seen[p.Name] = true
			b.at[p.Name] = now
			b.times = append(b.times, now)
			if len(b.times) == b.want {
				close(b.done)
			}
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var once sync.Once
	b.stop = func() { once.Do(func() { close(stop) }) }
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	t.Cleanup(b.stop)
	return b
}

// benchResult is one decider's figures.
type benchResult struct {
	name      string
	pods      int
	total     time.Duration // decider start to last binding
	rate      float64       // pods/s over the measured (second) half
	p50, p99  float64       // one scheduling attempt, seconds (NaN: not scraped)
	algorithm float64       // p99 of the scheduling algorithm alone, seconds
	attempts  float64
	traffic   apiCounters // per bound pod, at the API server
}

func (b *bindWatch) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.times)
}

func (b *bindWatch) wait(t *testing.T, name string, started time.Time, timeout time.Duration) benchResult {
	t.Helper()
	deadline := time.After(timeout)
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case <-b.done:
			break wait
		case <-progress.C:
			t.Logf("%s: %d of %d pods bound after %v", name, b.count(), b.want, time.Since(started).Round(time.Second))
		case <-deadline:
			t.Fatalf("%s: %d of %d pods bound after %v", name, b.count(), b.want, timeout)
		}
	}
	b.stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	times := append([]time.Time(nil), b.times...)
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	half := len(times) / 2
	measured := times[len(times)-1].Sub(times[half])
	return benchResult{
		name: name, pods: len(times), total: times[len(times)-1].Sub(started),
		rate: float64(len(times)-1-half) / measured.Seconds(),
		p50:  math.NaN(), p99: math.NaN(), algorithm: math.NaN(),
	}
}

// histogramQuantile is the q-quantile of a Prometheus histogram in `text` (series `name` whose
// labels contain `match`), linearly interpolated within the bucket as Prometheus does.
func histogramQuantile(text, name, match string, q float64) (float64, float64) {
	type bucket struct{ le, count float64 }
	var buckets []bucket
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"_bucket{") || !strings.Contains(line, match) {
			continue
		}
		i := strings.Index(line, `le="`)
		if i < 0 {
			continue
		}
		rest := line[i+4:]
		le, err := strconv.ParseFloat(rest[:strings.Index(rest, `"`)], 64) // "+Inf" parses too
		if err != nil {
			continue
		}
		f := strings.Fields(line)
		count, _ := strconv.ParseFloat(f[len(f)-1], 64)
		buckets = append(buckets, bucket{le, count})
	}
	if len(buckets) == 0 {
		return math.NaN(), 0
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	total := buckets[len(buckets)-1].count
	rank := q * total
	prevLe, prevCount := 0.0, 0.0
	for _, b := range buckets {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe, total
			}
			if b.count == prevCount {
				return b.le, total
			}
			return prevLe + (b.le-prevLe)*(rank-prevCount)/(b.count-prevCount), total
		}
		prevLe, prevCount = b.le, b.count
	}
	return math.NaN(), total
}

func (r *benchResult) fromMetrics(text, profile string) {
	match := `profile="` + profile + `"`
	r.p50, r.attempts = histogramQuantile(text, "scheduler_scheduling_attempt_duration_seconds", match, 0.5)
	r.p99, _ = histogramQuantile(text, "scheduler_scheduling_attempt_duration_seconds", match, 0.99)
	r.algorithm, _ = histogramQuantile(text, "scheduler_scheduling_algorithm_duration_seconds", "", 0.99)
}

// startBenchKubeScheduler runs a kube-scheduler of the control plane's build with one profile
// named `name`, client QPS and burst 5 000, and returns its secure metrics URL.
func startBenchKubeScheduler(t *testing.T, name string) string {
	t.Helper()
	url, _ := startBenchKubeSchedulerWith(t, name, "DRADeviceTaintRules=true")
	return url
}

// startBenchKubeSchedulerWith is startBenchKubeScheduler with its feature gates, returning the
// process too.
func startBenchKubeSchedulerWith(t *testing.T, name, gates string) (string, *process) {
	t.Helper()
	kubeconfig := filepath.Join(controlPlane.state, "scheduler.kubeconfig")
	config := filepath.Join(t.TempDir(), "kube-scheduler.yaml")
	writeFile(t, config, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 5000
  burst: 5000
leaderElection:
  leaderElect: false
profiles:
- schedulerName: %s
`, kubeconfig, name))
	port := freePort(t)
	p := startProgram(t, "kube-scheduler "+name, filepath.Join(controlPlane.bin, "kube-scheduler"),
		"--config", config, "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"--feature-gates", gates)
	return fmt.Sprintf("https://127.0.0.1:%d/metrics", port), p
}

// scrapeAsAdmin reads a control-plane component's secure /metrics with the admin certificate.
func scrapeAsAdmin(t *testing.T, url string) string {
	t.Helper()
	pki := filepath.Join(controlPlane.state, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, // a test's own loopback component
	}}}
	resp, err := client.Get(url)
	if err != nil {
		t.Logf("scrape %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// benchAllocation is the allocation of request "gpu" to device i%10 of node (a bench node's
// pool is named after it).
func benchAllocation(driver, node string, i int) *resourcev1.AllocationResult {
	return &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: node, Device: fmt.Sprintf("gpu-%d", i%benchDevicesPerNode),
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
}

// ceilingBind writes, for every pod of ns, what a scheduler writes, without deciding anything.
func ceilingBind(t *testing.T, c kubernetes.Interface, ns, set, driver string, pods int) {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byIndex := make([]*corev1.Pod, pods)
	for i := range list.Items {
		idx, _ := strconv.Atoi(strings.TrimPrefix(list.Items[i].Name, "b"))
		byIndex[idx] = &list.Items[i]
	}
	ceilingBindOrdered(t, c, ns, set, driver, byIndex)
}

// ceilingBindOrdered writes, for pod i of `pods` (all in ns), what a scheduler writes to put it
// on device i%10 of node i/10 of `set`, 64 writers at once.
func ceilingBindOrdered(t *testing.T, c kubernetes.Interface, ns, set, driver string, pods []*corev1.Pod) {
	t.Helper()
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*resourcev1.ResourceClaim{}
	for i := range claims.Items {
		byName[claims.Items[i].Name] = &claims.Items[i]
	}
	err = parallel(len(pods), 64, func(i int) error {
		pod := pods[i]
		node := fmt.Sprintf("%s-%d", set, i/benchDevicesPerNode)
		claim := byName[podClaimName(pod)].DeepCopy()
		claim.Finalizers = append(claim.Finalizers, "resource.kubernetes.io/delete-protection")
		claim, err := c.ResourceV1().ResourceClaims(ns).Update(ctx(t), claim, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		claim.Status.Allocation = benchAllocation(driver, node, i)
		claim.Status.Allocation.AllocationTimestamp = ptr.To(metav1.Now())
		claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
		if _, err := c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx(t), claim, metav1.UpdateOptions{}); err != nil {
			return err
		}
		if err := c.CoreV1().Pods(ns).Bind(ctx(t), &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod.Name, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		now := metav1.Now()
		_, err = c.CoreV1().Events(ns).Create(ctx(t), &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
			Reason:         "Scheduled", Type: corev1.EventTypeNormal, Count: 1,
			Message:        fmt.Sprintf("Successfully assigned %s/%s to %s", ns, pod.Name, node),
			Source:         corev1.EventSource{Component: "bench-ceiling"},
			FirstTimestamp: now, LastTimestamp: now,
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("ceiling binder: %v", err)
	}
}

func TestSchedulerThroughputBesideKubeScheduler(t *testing.T) {
	if os.Getenv("SCHEDULER_BENCH") == "" {
		t.Skip("set SCHEDULER_BENCH=1 to run the throughput comparison")
	}
	nodes := envInt("SCHEDULER_BENCH_NODES", 500)
	pods := envInt("SCHEDULER_BENCH_PODS", nodes*benchDevicesPerNode)
	only := map[string]bool{"kube": true, "devicelet": true, "ceiling": true}
	if v := os.Getenv("SCHEDULER_BENCH_ONLY"); v != "" {
		only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			only[s] = true
		}
	}
	c := benchClient(t)
	deciders := []string{"ceiling", "kube", "devicelet", "devicelet-http1-json"}
	if os.Getenv("SCHEDULER_BENCH_ONLY") == "" {
		only["devicelet-http1-json"] = false
	}
	// Everything is created first: nodes, slices, pods and their claims for every decider.
	for _, d := range deciders {
		if !only[d] {
			continue
		}
		started := time.Now()
		benchNodes(t, c, "bench-"+d, d+".example.com", nodes)
		driverClass(t, "bench-"+d, d+".example.com")
		ns := namespace(t, "bench-"+d)
		createTemplate(t, ns, "gpu", claimSpec("bench-"+d))
		benchPods(t, c, ns, "bench-"+d, "bench-"+d, pods)
		t.Logf("%s: %d nodes, %d pods with their claims created in %v", d, nodes, pods, time.Since(started))
	}
	var results []benchResult
	for _, d := range deciders {
		if !only[d] {
			continue
		}
		ns := "bench-" + d
		watch := watchBinds(t, c, ns, pods)
		trafficBefore := apiTraffic(t, c)
		started := time.Now()
		var r benchResult
		switch d {
		case "ceiling":
			ceilingBind(t, c, ns, ns, d+".example.com", pods)
			r = watch.wait(t, "API server ceiling (binder deciding nothing)", started, 900*time.Second)
		case "kube":
			url := startBenchKubeScheduler(t, ns)
			r = watch.wait(t, "kube-scheduler v1.36.3 (QPS 5000)", started, 1800*time.Second)
			r.fromMetrics(scrapeAsAdmin(t, url), ns)
		case "devicelet":
			_, addr := startScheduler(t, "--scheduler-name", ns)
			r = watch.wait(t, "devicelet scheduler", started, 900*time.Second)
			r.fromMetrics(scrape(t, addr), ns)
		case "devicelet-http1-json":
			addr := startSchedulerHTTP1JSON(t, ns)
			r = watch.wait(t, "devicelet scheduler, HTTP/1.1 + JSON", started, 900*time.Second)
			r.fromMetrics(scrape(t, addr), ns)
		}
		// The decider's writes have reached the API server by the last binding; its last
		// events may still be on their way.
		time.Sleep(2 * time.Second)
		r.traffic = apiTraffic(t, c).minus(trafficBefore).per(float64(r.pods))
		t.Logf("%s: %d pods bound in %v; %.1f pods/s over the second half; attempt p50 %.1f ms p99 %.1f ms (%.0f attempts), algorithm p99 %.2f ms",
			r.name, r.pods, r.total.Round(time.Millisecond), r.rate, r.p50*1e3, r.p99*1e3, r.attempts, r.algorithm*1e3)
		results = append(results, r)
		if d != "ceiling" && nodes*benchDevicesPerNode >= pods && pods <= 2000 {
			checkAgainstGoAllocator(t, ns)
		}
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%d nodes × %d devices, %d pods with one template claim each, per decider:\n", nodes, benchDevicesPerNode, pods)
	fmt.Fprintf(&table, "%-45s %10s %12s %14s %14s\n", "decider", "pods/s", "start→last", "attempt p99", "algorithm p99")
	for _, r := range results {
		fmt.Fprintf(&table, "%-45s %10.1f %12v %12.1f ms %12.2f ms\n", r.name, r.rate, r.total.Round(time.Millisecond), r.p99*1e3, r.algorithm*1e3)
	}
	// The API server measures the answers of reads only (apiserver_response_sizes).
	fmt.Fprintf(&table, "\nAPI server, per bound pod (every client, watches apart):\n%-45s %9s %14s %18s  %s\n", "decider", "requests", "request bytes", "GET/LIST answers", "requests by verb/resource")
	for _, r := range results {
		fmt.Fprintf(&table, "%-45s %9.2f %14.0f %18.0f  %s\n", r.name, r.traffic.requests, r.traffic.requestBytes, r.traffic.readBytes, r.traffic.breakdown())
	}
	t.Log(table.String())
}

// preallocate creates the allocated claims init-FROM..init-TO-1 in ns (device i%10 of node
// SET-i/10 of driver), as scheduler_perf's initClaims: devices in use, reserved by nobody.
func preallocate(t *testing.T, c kubernetes.Interface, ns, set, driver string, from, to int) {
	t.Helper()
	err := parallel(to-from, 64, func(k int) error {
		i := from + k
		node := fmt.Sprintf("%s-%d", set, i/benchDevicesPerNode)
		claim := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("init-%d", i), Namespace: ns},
			Spec:       claimSpec(set),
		}
		claim, err := c.ResourceV1().ResourceClaims(ns).Create(ctx(t), claim, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		claim.Status.Allocation = benchAllocation(driver, node, i)
		_, err = c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx(t), claim, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("preallocate claims in %s: %v", ns, err)
	}
}

// steadyState keeps `inFlight` pods with a template claim pending for `scheduler` in ns: each
// pod seen bound is deleted and replaced, for `duration`. Returns pods bound per second. The
// pods and their claims are gone again when it returns.
func steadyState(t *testing.T, c kubernetes.Interface, ns, set, scheduler string, inFlight int, duration time.Duration) float64 {
	t.Helper()
	var seq, bound atomic.Int64
	deadline := time.Now().Add(duration)
	create := func() {
		name := fmt.Sprintf("s%d", seq.Add(1))
		spec := podSpec("", 0)
		spec.SchedulerName = scheduler
		spec.NodeSelector = map[string]string{"devicelet.dev/bench": set}
		spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		usePodClaim(&spec, "gpu", "")
		if _, err := c.CoreV1().Pods(ns).Create(ctx(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Logf("create %s: %v", name, err)
		}
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			return
		}
		mu.Lock()
		first := !seen[p.Name]
		seen[p.Name] = true
		mu.Unlock()
		if !first || time.Now().After(deadline) {
			return
		}
		bound.Add(1)
		go func() {
			_ = c.CoreV1().Pods(ns).Delete(ctx(t), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			create()
		}()
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	started := time.Now()
	for i := 0; i < inFlight; i++ {
		go create()
	}
	time.Sleep(time.Until(deadline))
	rate := float64(bound.Load()) / time.Since(started).Seconds()
	close(stop)
	// Clean up: every pod gone, and with it every template claim (kube-controller-manager).
	waitForEvery(t, 300*time.Second, time.Second, ns+": steady-state pods and their claims gone", func() (bool, string) {
		_ = c.CoreV1().Pods(ns).DeleteCollection(ctx(t), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, cl := range claims.Items {
			if !strings.HasPrefix(cl.Name, "init-") {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d claims of steady-state pods left", left)
	})
	return rate
}

// scheduler_perf's SteadyStateClusterResourceClaimTemplate (S160) empty, half and full: nodes
// with 10 devices each, initClaims allocated claims (0, half the devices, all but 10), then 10
// pods with a template claim kept pending for SCHEDULER_STEADY_SECONDS (default 10): each pod
// bound is deleted and replaced. Run with SCHEDULER_BENCH=1 (and SCHEDULER_BENCH_NODES,
// SCHEDULER_BENCH_ONLY=kube,devicelet as above).
func TestSchedulerSteadyState(t *testing.T) {
	if os.Getenv("SCHEDULER_BENCH") == "" {
		t.Skip("set SCHEDULER_BENCH=1 to run the steady-state comparison")
	}
	nodes := envInt("SCHEDULER_BENCH_NODES", 500)
	duration := time.Duration(envInt("SCHEDULER_STEADY_SECONDS", 10)) * time.Second
	only := map[string]bool{"kube": true, "devicelet": true}
	if v := os.Getenv("SCHEDULER_BENCH_ONLY"); v != "" {
		only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			only[s] = true
		}
	}
	c := benchClient(t)
	levels := []struct {
		name string
		init int
	}{{"empty", 0}, {"half", nodes * benchDevicesPerNode / 2}, {"full", nodes*benchDevicesPerNode - 10}}
	var table strings.Builder
	fmt.Fprintf(&table, "\nSteadyStateClusterResourceClaimTemplate, %d nodes × %d devices, 10 pods in flight, %v per level (pods/s):\n", nodes, benchDevicesPerNode, duration)
	for _, d := range []string{"kube", "devicelet"} {
		if !only[d] {
			continue
		}
		set, driver := "steady-"+d, d+".example.com"
		benchNodes(t, c, set, driver, nodes)
		driverClass(t, set, driver)
		ns := namespace(t, set)
		createTemplate(t, ns, "gpu", claimSpec(set))
		name := "kube-scheduler v1.36.3 (QPS 5000)"
		if d == "kube" {
			startBenchKubeScheduler(t, set)
		} else {
			name = "devicelet scheduler"
			startScheduler(t, "--scheduler-name", set)
		}
		allocated := 0
		fmt.Fprintf(&table, "%-40s", name)
		for _, level := range levels {
			preallocate(t, c, ns, set, driver, allocated, level.init)
			allocated = level.init
			rate := steadyState(t, c, ns, set, set, 10, duration)
			t.Logf("%s, %s (%d claims allocated): %.1f pods/s", name, level.name, level.init, rate)
			fmt.Fprintf(&table, " %s %7.1f", level.name, rate)
		}
		table.WriteString("\n")
	}
	t.Log(table.String())
}

// startSchedulerHTTP1JSON runs `devicelet scheduler` for profile `name` as it talked to the API
// server before issue 42: HTTP/1.1 (DEVICELET_KUBE_API_HTTP1) and JSON writes
// (clientConnection.contentType). Returns its metrics address.
func startSchedulerHTTP1JSON(t *testing.T, name string) string {
	t.Helper()
	schedulerRBAC(t)
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	writeFile(t, config, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  contentType: application/json
profiles:
- schedulerName: %s
`, name))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startProgramEnv(t, "devicelet scheduler (HTTP/1.1, JSON)", os.Getenv("DEVICELET_BIN"),
		[]string{"RUST_LOG=info", "NO_COLOR=1", "DEVICELET_KUBE_API_HTTP1=1"},
		"scheduler", "--kubeconfig", filepath.Join(controlPlane.state, "scheduler.kubeconfig"),
		"--metrics-address", addr, "--config", config)
	if err := schedulerReady(p, addr, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return addr
}

// apiCounters is what the API server counted: requests by verb/resource (watches apart), the
// bytes of request bodies and of answers to reads.
type apiCounters struct {
	requests, requestBytes float64
	// readBytes: the answers to GET and LIST (the informers' first lists, most of it); the
	// API server does not measure the answers of writes.
	readBytes float64
	byKind    map[string]float64
}

// apiTraffic reads the API server's request counters (as admin).
func apiTraffic(t *testing.T, c kubernetes.Interface) apiCounters {
	t.Helper()
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("API server metrics: %v", err)
	}
	out := apiCounters{byKind: map[string]float64{}}
	for _, line := range strings.Split(string(raw), "\n") {
		name, labels, value, ok := promSample(line)
		if !ok {
			continue
		}
		verb := labels["verb"]
		if verb == "WATCH" || verb == "WATCHLIST" || verb == "CONNECT" {
			continue
		}
		switch name {
		case "apiserver_request_total":
			out.requests += value
			kind := verb + " " + labels["resource"]
			if labels["subresource"] != "" {
				kind += "/" + labels["subresource"]
			}
			out.byKind[kind] += value
		case "apiserver_request_body_size_bytes_sum":
			out.requestBytes += value
		case "apiserver_response_sizes_sum":
			out.readBytes += value
		}
	}
	return out
}

// promSample splits one Prometheus text sample into its name, labels and value.
func promSample(line string) (string, map[string]string, float64, bool) {
	if line == "" || line[0] == '#' {
		return "", nil, 0, false
	}
	open := strings.IndexByte(line, '{')
	end := strings.LastIndexByte(line, '}')
	if open < 0 || end < open {
		return "", nil, 0, false
	}
	value, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
	if err != nil {
		return "", nil, 0, false
	}
	labels := map[string]string{}
	for _, pair := range strings.Split(line[open+1:end], ",") {
		k, v, ok := strings.Cut(pair, "=")
		if ok {
			labels[k] = strings.Trim(v, `"`)
		}
	}
	return line[:open], labels, value, true
}

func (a apiCounters) minus(b apiCounters) apiCounters {
	out := apiCounters{a.requests - b.requests, a.requestBytes - b.requestBytes, a.readBytes - b.readBytes, map[string]float64{}}
	for k, v := range a.byKind {
		if d := v - b.byKind[k]; d > 0 {
			out.byKind[k] = d
		}
	}
	return out
}

func (a apiCounters) per(n float64) apiCounters {
	out := apiCounters{a.requests / n, a.requestBytes / n, a.readBytes / n, map[string]float64{}}
	for k, v := range a.byKind {
		out.byKind[k] = v / n
	}
	return out
}

// breakdown lists the kinds of request of at least 0.05 per pod, most first.
func (a apiCounters) breakdown() string {
	type kv struct {
		k string
		v float64
	}
	var kinds []kv
	for k, v := range a.byKind {
		if v >= 0.05 {
			kinds = append(kinds, kv{k, v})
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].v > kinds[j].v })
	var parts []string
	for _, e := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.2f", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}
