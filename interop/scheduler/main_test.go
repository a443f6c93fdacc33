package scheduler

import (
	"flag"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

func TestMain(m *testing.M) {
	// Quiet: the config defaulting logs every re-configured plugin at level 0.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	// The framework records into the scheduler's metrics, which exist once registered (as
	// kube-scheduler does at start).
	metrics.Register()
	os.Exit(m.Run())
}
