package cluster

// `devicelet dev-cluster` (issue 40): a dev cluster of 3 devicelet nodes from the project's
// control-plane binaries; the upstream DRA test driver started on node 2 exactly as
// docs/drivers.md says (its marked block is run as written, with this test's directory); the
// objects of examples/dra/dev-cluster-pod.yaml applied with kubectl; the pod Running on node 2;
// `get slices` listing the driver's devices; `down` leaving no process behind, the driver's
// included. The dev cluster is a second control plane beside the suite's own.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// deviceletOut runs the devicelet binary and returns its combined output and error.
func deviceletOut(args ...string) (string, error) {
	out, err := exec.Command(os.Getenv("DEVICELET_BIN"), args...).CombinedOutput()
	return string(out), err
}

// guideDriverBlock is the shell block of docs/drivers.md between the dev-cluster-driver
// markers, without its code fences.
func guideDriverBlock(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "drivers.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	begin := strings.Index(text, "<!-- dev-cluster-driver: begin")
	end := strings.Index(text, "<!-- dev-cluster-driver: end")
	if begin < 0 || end < begin {
		t.Fatal("docs/drivers.md has no dev-cluster-driver block")
	}
	var lines []string
	for _, line := range strings.Split(text[begin:end], "\n")[1:] {
		if strings.HasPrefix(line, "```") || strings.HasPrefix(line, "<!--") {
			continue
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// processesNaming lists the live processes whose command line contains `needle`.
func processesNaming(needle string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := fmt.Sscanf(e.Name(), "%d", new(int)); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), needle) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := strings.LastIndex(string(stat), ")"); i > 0 && strings.HasPrefix(strings.TrimSpace(string(stat)[i+1:]), "Z") {
			continue // a zombie is gone, only not reaped yet
		}
		found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return found
}

func TestDevClusterRunsADriverAsTheGuideSays(t *testing.T) {
	dir := shortTempDir(t)
	t.Cleanup(func() {
		if out, err := deviceletOut("dev-cluster", "down", "--dir", dir); err != nil {
			t.Logf("cleanup down: %v\n%s", err, out)
		}
		if t.Failed() {
			for _, log := range []string{"kube-apiserver", "devicelet-scheduler", "node-dev-node-2"} {
				tailLog(filepath.Join(dir, "logs", log+".log"), 20)
			}
		}
	})
	start := time.Now()
	out, err := deviceletOut("dev-cluster", "up", "--dir", dir, "--nodes", "3", "--bin-dir", controlPlane.bin)
	if err != nil {
		t.Fatalf("dev-cluster up: %v\n%s", err, out)
	}
	t.Logf("dev-cluster up --nodes 3: %.1fs\n%s", time.Since(start).Seconds(), out)
	for _, want := range []string{"3 devicelet node(s) Ready", "export KUBECONFIG=" + dir + "/kubeconfig", "--node-name dev-node-2"} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q", want)
		}
	}
	if again, err := deviceletOut("dev-cluster", "up", "--dir", dir); err == nil || !strings.Contains(again, "a dev cluster is running in "+dir) {
		t.Errorf("a second up on a live directory: err %v\n%s", err, again)
	}

	// The driver exactly as the guide starts it, in this test's directory.
	script := regexp.MustCompile(`(?m)^DIR=.*$`).ReplaceAllString(guideDriverBlock(t), "DIR="+dir)
	driver := startProgram(t, "dra-test-driver (docs/drivers.md)", "bash", "-c",
		"set -eu\nexport PATH="+controlPlane.bin+":$PATH\n"+script)
	root := filepath.Join(dir, "nodes", "dev-node-2")
	var devices []string
	waitFor(t, 60*time.Second, "get slices on dev-node-2 to list the driver's devices", func() (bool, string) {
		select {
		case <-driver.exited:
			t.Fatalf("the driver exited:\n%s", lastLines(driver.output.String(), 30))
		default:
		}
		out, err := deviceletOut("--root-dir", root, "get", "slices", "-o", "json")
		if err != nil {
			return false, out
		}
		var list struct {
			Items []struct {
				Spec struct {
					Driver   string `json:"driver"`
					NodeName string `json:"nodeName"`
					Devices  []struct {
						Name string `json:"name"`
					} `json:"devices"`
				} `json:"spec"`
			} `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return false, err.Error()
		}
		devices = nil
		for _, s := range list.Items {
			if s.Spec.Driver == testDriver && s.Spec.NodeName == "dev-node-2" {
				for _, d := range s.Spec.Devices {
					devices = append(devices, d.Name)
				}
			}
		}
		return len(devices) > 0, out
	})
	table, err := deviceletOut("--root-dir", root, "get", "slices")
	if err != nil {
		t.Fatalf("get slices: %v\n%s", err, table)
	}
	for _, d := range devices {
		if !strings.Contains(table, d) {
			t.Errorf("get slices lacks device %s:\n%s", d, table)
		}
	}
	t.Logf("get slices on dev-node-2:\n%s", table)
	if other, err := deviceletOut("--root-dir", filepath.Join(dir, "nodes", "dev-node-1"), "get", "slices"); err != nil || strings.Contains(other, testDriver) {
		t.Errorf("dev-node-1 lists the driver of dev-node-2: %v\n%s", err, other)
	}

	// The guide's objects, applied as the guide says.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	apply := exec.Command(filepath.Join(controlPlane.bin, "kubectl"), "--kubeconfig", kubeconfig,
		"apply", "-f", filepath.Join("..", "..", "examples", "dra", "dev-cluster-pod.yaml"))
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(config)
	waitFor(t, 60*time.Second, "pod with-device Running on dev-node-2", func() (bool, string) {
		pod, err := client.CoreV1().Pods("default").Get(ctx(t), "with-device", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return pod.Spec.NodeName == "dev-node-2" && pod.Status.Phase == corev1.PodRunning,
			fmt.Sprintf("node %q phase %s", pod.Spec.NodeName, pod.Status.Phase)
	})
	pods, err := deviceletOut("--root-dir", root, "get", "pods", "-o", "json")
	if err != nil || !strings.Contains(pods, `"cdiDevices"`) || !strings.Contains(pods, testDriver) {
		t.Errorf("get pods on dev-node-2 shows no prepared claim: %v\n%s", err, pods)
	}
	if status, err := deviceletOut("dev-cluster", "status", "--dir", dir); err != nil {
		t.Errorf("status of a healthy cluster failed: %v\n%s", err, status)
	}

	start = time.Now()
	down, err := deviceletOut("dev-cluster", "down", "--dir", dir)
	if err != nil {
		t.Fatalf("dev-cluster down: %v\n%s", err, down)
	}
	t.Logf("dev-cluster down: %.1fs\n%s", time.Since(start).Seconds(), down)
	if !strings.Contains(down, "dra-test-driver") {
		t.Errorf("down did not name the driver it stopped:\n%s", down)
	}
	select {
	case <-driver.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("the driver still runs after down")
	}
	if left := processesNaming(dir); len(left) > 0 {
		t.Errorf("processes left after down:\n%s", strings.Join(left, "\n"))
	}
	if status, err := deviceletOut("dev-cluster", "status", "--dir", dir); err == nil {
		t.Errorf("status after down succeeded:\n%s", status)
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "kube-apiserver.log")); err != nil {
		t.Errorf("down removed the logs: %v", err)
	}
}
