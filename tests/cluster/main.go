// Command captf-envtest runs a real Kubernetes control plane on loopback for CAPTF's
// tests: an embedded etcd, kube-apiserver and kube-controller-manager (built from the
// Kubernetes Go modules of go.mod), and the local kubelet of tests/kubelet, which
// registers a Node and runs Pods as local processes.
//
//	captf-envtest --kubeconfig PATH
//
// writes an admin kubeconfig to PATH (atomically) once every component is up and the
// Node is Ready, then runs until SIGTERM or SIGINT (or, with --exit-on-stdin-close, until
// its standard input closes), and stops everything cleanly. See README.md beside it.
//
//	captf-envtest --kubeconfig PATH --cluster-api
//
// also installs Cluster API's CRDs, RBAC and webhook configurations and runs its real
// core manager (capi.go).
//
// kube-apiserver and kube-controller-manager run as child processes of this program
// (the subcommands of the same names), each as its real command with its real flags, so
// that the two keep their own process-wide state as in a real cluster.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/captf/captf/tests/cluster/ports"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// nodeName is the one Node of the cluster, served by the local kubelet.
const nodeName = "captf-local"

// controllers are the kube-controller-manager controllers that run. Those that need
// cloud providers, volumes, node IPAM or a scheduler are left out.
var controllers = []string{
	"job-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"resourcequota-controller",
	"ttl-after-finished-controller",
	"root-ca-certificate-publisher-controller",
	"pod-garbage-collector-controller",
	"clusterrole-aggregation-controller",
	"cronjob-controller",
	"replicaset-controller",
	"deployment-controller",
}

func main() {
	// Children get SIGKILL when the thread that started them ends (Pdeathsig): start
	// them from the main thread, which lives as long as the process.
	runtime.LockOSThread()
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "kube-apiserver":
			os.Exit(component(apiserverapp.NewAPIServerCommand(), os.Args[2:]))
		case "kube-controller-manager":
			os.Exit(component(kcmapp.NewControllerManagerCommand(), os.Args[2:]))
		}
	}
	os.Exit(run(os.Args[1:]))
}

// component runs one Kubernetes component's own command with args.
func component(cmd *cobra.Command, args []string) int {
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type options struct {
	kubeconfig   string
	dataDir      string
	kubelet      string
	kubeletArgs  multiFlag
	kcmArgs      multiFlag
	crds         multiFlag
	objects      multiFlag
	stdinClose   bool
	keepData     bool
	readyTimeout time.Duration

	clusterAPI     bool
	capiManager    string
	capiComponents string
	capiArgs       multiFlag
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "captf-envtest: "+format+"\n", args...)
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("captf-envtest", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "where to write the admin kubeconfig once the cluster is ready (required)")
	fs.StringVar(&o.dataDir, "data-dir", "", "etcd data, certificates, logs and the kubelet's Pods (default: a new temporary directory, removed on stop)")
	fs.StringVar(&o.kubelet, "kubelet", "", "the local kubelet binary (default: $CAPTF_KUBELET, else captf-kubelet beside this program)")
	fs.Var(&o.kubeletArgs, "kubelet-arg", "an extra argument for the kubelet (repeatable)")
	fs.Var(&o.kcmArgs, "kcm-arg", "an extra argument for kube-controller-manager, after its own (repeatable; the scale bench raises its client's QPS)")
	fs.Var(&o.crds, "crds", "a YAML or JSON file of CustomResourceDefinitions, or a directory of them, installed before the controllers start (repeatable)")
	fs.Var(&o.objects, "objects", "a YAML or JSON file of other objects (a ClusterRole, say), applied server-side after the CRDs and before the controllers start (repeatable)")
	fs.BoolVar(&o.stdinClose, "exit-on-stdin-close", false, "stop when standard input closes (for a parent process that may die without a signal)")
	fs.BoolVar(&o.keepData, "keep-data", false, "keep the data directory on stop")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 3*time.Minute, "how long each component may take to become ready")
	fs.BoolVar(&o.clusterAPI, "cluster-api", false, "also install Cluster API (its CRDs, RBAC and webhooks, from --capi-components) and run its core manager (--capi-manager)")
	fs.StringVar(&o.capiManager, "capi-manager", "", "with --cluster-api: Cluster API's core manager (default: capi-manager beside this program)")
	fs.StringVar(&o.capiComponents, "capi-components", "", "with --cluster-api: Cluster API's core-components.yaml (default: capi/core-components.yaml beside this program)")
	fs.Var(&o.capiArgs, "capi-manager-arg", "with --cluster-api: an extra argument for the Cluster API manager, after its own (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: captf-envtest --kubeconfig PATH [flags]\n\nA real Kubernetes control plane on loopback (etcd, kube-apiserver, kube-controller-manager, a local kubelet).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.kubeconfig == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if o.kubelet == "" {
		o.kubelet = os.Getenv("CAPTF_KUBELET")
	}
	selfDir := ""
	if self, err := os.Executable(); err == nil {
		selfDir = filepath.Dir(self)
	}
	if o.kubelet == "" && selfDir != "" {
		o.kubelet = filepath.Join(selfDir, "captf-kubelet")
	}
	if o.clusterAPI {
		if o.capiManager == "" {
			o.capiManager = filepath.Join(selfDir, "capi-manager")
		}
		if o.capiComponents == "" {
			o.capiComponents = filepath.Join(selfDir, "capi", "core-components.yaml")
		}
		if st, err := os.Stat(o.capiManager); err != nil || st.IsDir() {
			say("the Cluster API manager %q is not there: build it (tests/cluster/build builds it beside captf-envtest) or name it with --capi-manager", o.capiManager)
			return 2
		}
		if st, err := os.Stat(o.capiComponents); err != nil || st.IsDir() {
			say("Cluster API's components %q are not there: make them (tests/cluster/build generates them beside captf-envtest) or name them with --capi-components", o.capiComponents)
			return 2
		}
	} else if o.capiManager != "" || o.capiComponents != "" || len(o.capiArgs) > 0 {
		say("--capi-manager, --capi-components and --capi-manager-arg need --cluster-api")
		return 2
	}
	crds, err := readCRDs(o.crds)
	if err != nil {
		say("--crds: %v", err)
		return 2
	}
	if st, err := os.Stat(o.kubelet); err != nil || st.IsDir() {
		say("the local kubelet %q is not there: build it (tests/cluster/build) or name it with --kubelet or CAPTF_KUBELET", o.kubelet)
		return 2
	}
	// The kubeconfig appears only when the cluster is ready: an old one must not be
	// taken for the new cluster's.
	if err := os.Remove(o.kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
		say("cannot remove the old kubeconfig %s: %v", o.kubeconfig, err)
		return 1
	}

	objects, err := readObjects(o.objects)
	if err != nil {
		say("--objects: %v", err)
		return 2
	}
	c := &cluster{opts: o, crds: crds, objects: objects}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan string, 4)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { s := <-sigs; stop <- "received " + s.String() }()
	if o.stdinClose {
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop <- "standard input closed" }()
	}
	c.died = make(chan string, 4)

	started := make(chan error, 1)
	go func() { started <- c.start(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			say("start failed: %v", err)
			c.stop()
			return 1
		}
	case why := <-stop:
		say("%s while starting: stopping", why)
		cancel()
		c.stop()
		return 1
	case why := <-c.died:
		say("while starting, %s", why)
		c.stop()
		return 1
	}

	code := 0
	select {
	case why := <-stop:
		say("%s: stopping", why)
	case why := <-c.died:
		say("%s: stopping the cluster", why)
		code = 1
	}
	t := time.Now()
	c.stop()
	_ = os.Remove(o.kubeconfig)
	say("stopped in %.1fs", time.Since(t).Seconds())
	return code
}

// cluster is the running control plane.
type cluster struct {
	opts     options
	crds     []*apiextensionsv1.CustomResourceDefinition
	objects  []*unstructured.Unstructured
	dataDir  string
	tempData bool
	pki      *pki
	etcd     *etcdServer
	server   string
	adminCfg []byte

	mu       sync.Mutex
	children []*child
	stopping bool
	died     chan string
}

// child is a component running as a process of its own.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// freePort picks a port a component listens on: see package ports.
func freePort() (int, error) {
	return ports.Free()
}

func (c *cluster) start(ctx context.Context) error {
	t0 := time.Now()
	if c.opts.dataDir == "" {
		d, err := os.MkdirTemp("", "captf-envtest-")
		if err != nil {
			return err
		}
		c.dataDir, c.tempData = d, true
	} else {
		c.dataDir = c.opts.dataDir
		if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"logs", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(c.dataDir, d), 0o755); err != nil {
			return err
		}
	}
	say("data and logs in %s", c.dataDir)

	p, err := newPKI(filepath.Join(c.dataDir, "pki"))
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	c.pki = p
	ports := map[string]int{}
	portNames := []string{"etcd-client", "etcd-peer", "apiserver", "kcm", "kubelet"}
	if c.opts.clusterAPI {
		portNames = append(portNames, "capi-webhook", "capi-health")
	}
	for _, n := range portNames {
		if ports[n], err = freePort(); err != nil {
			return err
		}
	}
	c.server = fmt.Sprintf("https://127.0.0.1:%d", ports["apiserver"])
	loopbackHosts := []string{"127.0.0.1", "localhost"}
	serving, err := p.issue("apiserver", "kube-apiserver", nil, append(loopbackHosts,
		"10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"))
	if err != nil {
		return err
	}
	admin, err := p.issue("admin", "captf-envtest-admin", []string{"system:masters"}, nil)
	if err != nil {
		return err
	}
	kubeletClient, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil)
	if err != nil {
		return err
	}
	kcm, err := p.issue("kube-controller-manager", "system:kube-controller-manager", nil, loopbackHosts)
	if err != nil {
		return err
	}
	node, err := p.issue("kubelet", "system:node:"+nodeName, []string{"system:nodes"}, loopbackHosts)
	if err != nil {
		return err
	}
	scheduler, err := p.issue("scheduler", "system:kube-scheduler", nil, nil)
	if err != nil {
		return err
	}
	// Cluster API's manager runs as its ServiceAccount, as its Pod would: the user name
	// and groups the API server gives that account's token, so that its RBAC (the
	// aggregated ClusterRole included) and any admission rule naming it apply.
	capiManager, err := p.issue("capi-manager", "system:serviceaccount:capi-system:capi-manager",
		[]string{"system:serviceaccounts", "system:serviceaccounts:capi-system"}, nil)
	if err != nil {
		return err
	}
	kubeconfigs := map[string]certPair{"admin": admin, "kube-controller-manager": kcm, "kubelet": node, "scheduler": scheduler, "capi-manager": capiManager}
	for name, pair := range kubeconfigs {
		data, err := kubeconfig(c.server, p.CAFile(), pair, name)
		if err != nil {
			return err
		}
		if name == "admin" {
			c.adminCfg = data
		}
		if err := os.WriteFile(filepath.Join(c.dataDir, name+".kubeconfig"), data, 0o600); err != nil {
			return err
		}
	}
	tPKI := time.Since(t0)
	var capi *capiComponents
	var tComponents time.Duration
	if c.opts.clusterAPI {
		t := time.Now()
		// The manager's webhook server: signed by the cluster's CA, which the webhook
		// configurations and the CRDs' conversion name as their CA bundle.
		if _, err := p.issue("capi-webhook", "capi-webhook", nil, loopbackHosts); err != nil {
			return err
		}
		ca, err := os.ReadFile(p.CAFile())
		if err != nil {
			return err
		}
		capi, err = readCAPIComponents(c.opts.capiComponents, ports["capi-webhook"], ca)
		if err != nil {
			return fmt.Errorf("cluster API components: %w", err)
		}
		c.crds = append(c.crds, capi.crds...)
		tComponents = time.Since(t)
	}

	t := time.Now()
	c.etcd, err = startEtcd(filepath.Join(c.dataDir, "etcd"), ports["etcd-client"], ports["etcd-peer"],
		filepath.Join(c.dataDir, "logs", "etcd.log"), c.opts.readyTimeout)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	tEtcd := time.Since(t)
	say("etcd ready in %.1fs at %s", tEtcd.Seconds(), c.etcd.url)

	t = time.Now()
	err = c.spawn("kube-apiserver", []string{
		"--etcd-servers=" + c.etcd.url,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports["apiserver"]),
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback address: the kubernetes Service has
		// no endpoints; Pods reach the API server through KUBERNETES_SERVICE_HOST/PORT,
		// which the local kubelet sets to this server.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(c.dataDir, "apiserver"),
		"--tls-cert-file=" + serving.Cert,
		"--tls-private-key-file=" + serving.Key,
		"--client-ca-file=" + p.CAFile(),
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		// Added to the default admission plugins, which all stay on.
		"--enable-admission-plugins=NodeRestriction",
		"--kubelet-certificate-authority=" + p.CAFile(),
		"--kubelet-client-certificate=" + kubeletClient.Cert,
		"--kubelet-client-key=" + kubeletClient.Key,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--profiling=false",
		"--event-ttl=1h",
	})
	if err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-apiserver", c.server+"/readyz", true); err != nil {
		return err
	}
	tAPI := time.Since(t)
	say("kube-apiserver ready in %.1fs at %s", tAPI.Seconds(), c.server)
	var tCRDs time.Duration
	if len(c.crds) > 0 {
		t = time.Now()
		if err := c.installCRDs(ctx, c.crds); err != nil {
			return err
		}
		tCRDs = time.Since(t)
		say("%d CRDs installed and established in %.1fs", len(c.crds), tCRDs.Seconds())
	}
	if capi != nil {
		t = time.Now()
		if err := c.applyObjects(ctx, capi.objects); err != nil {
			return fmt.Errorf("cluster API components: %w", err)
		}
		tApply := time.Since(t)
		say("Cluster API: %s read and localized in %.1fs (webhooks and conversion at https://127.0.0.1:%d; left out: %s), its %d CRDs installed above, %d objects applied in %.1fs",
			c.opts.capiComponents, tComponents.Seconds(), ports["capi-webhook"], strings.Join(capi.dropped, ", "),
			len(capi.crds), len(capi.objects), tApply.Seconds())
		tComponents += tApply
	}
	if len(c.objects) > 0 {
		t = time.Now()
		if err := c.applyObjects(ctx, c.objects); err != nil {
			return fmt.Errorf("--objects: %w", err)
		}
		say("%d objects of --objects applied in %.1fs", len(c.objects), time.Since(t).Seconds())
	}

	t = time.Now()
	err = c.spawn("kube-controller-manager", append([]string{
		"--kubeconfig=" + filepath.Join(c.dataDir, "kube-controller-manager.kubeconfig"),
		"--authentication-kubeconfig=" + filepath.Join(c.dataDir, "kube-controller-manager.kubeconfig"),
		"--authorization-kubeconfig=" + filepath.Join(c.dataDir, "kube-controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports["kcm"]),
		"--tls-cert-file=" + kcm.Cert,
		"--tls-private-key-file=" + kcm.Key,
		"--leader-elect=false",
		"--controllers=" + strings.Join(controllers, ","),
		"--service-account-private-key-file=" + p.path("sa.key"),
		"--root-ca-file=" + p.CAFile(),
		"--use-service-account-credentials=true",
		"--profiling=false",
	}, c.opts.kcmArgs...))
	if err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-controller-manager", fmt.Sprintf("https://127.0.0.1:%d/healthz", ports["kcm"]), false); err != nil {
		return err
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	// The controllers act once their informers have synced: wait for what two of them
	// create in every namespace.
	if err := c.poll(ctx, "the service account and root CA controllers", func() (bool, error) {
		if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	tKCM := time.Since(t)
	say("kube-controller-manager ready in %.1fs", tKCM.Seconds())

	// Cluster API's manager starts before the kubelet, so that the kubelet still stops
	// first.
	var tCAPI time.Duration
	if capi != nil {
		t = time.Now()
		args := append([]string{
			"--kubeconfig=" + filepath.Join(c.dataDir, "capi-manager.kubeconfig"),
			"--leader-elect=false",
			fmt.Sprintf("--webhook-port=%d", ports["capi-webhook"]),
			"--webhook-cert-dir=" + p.dir,
			"--webhook-cert-name=capi-webhook.crt",
			"--webhook-key-name=capi-webhook.key",
			fmt.Sprintf("--health-addr=127.0.0.1:%d", ports["capi-health"]),
			// No metrics server: nothing reads it, and a fixed port would clash.
			"--diagnostics-address=0",
			"--insecure-diagnostics",
			"--feature-gates=" + capiFeatureGates,
		}, c.opts.capiArgs...)
		// Without a Pod's metadata the manager reaches this cluster through its
		// kubeconfig, as a manager running outside it does.
		var env []string
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); k != "POD_NAMESPACE" && k != "POD_NAME" && k != "POD_UID" {
				env = append(env, kv)
			}
		}
		if err := c.spawnBinaryEnv("capi-manager", c.opts.capiManager, args, env); err != nil {
			return err
		}
		if err := c.waitCAPIManager(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports["capi-health"])); err != nil {
			return fmt.Errorf("%w\nthe last lines of %s:\n%s", err, filepath.Join(c.dataDir, "logs", "capi-manager.log"),
				tail(filepath.Join(c.dataDir, "logs", "capi-manager.log"), 30))
		}
		tCAPI = time.Since(t)
		say("Cluster API manager ready in %.1fs, its webhooks answering (%s)", tCAPI.Seconds(), c.opts.capiManager)
	}

	t = time.Now()
	kubeletArgs := append([]string{
		"--kubeconfig=" + filepath.Join(c.dataDir, "kubelet.kubeconfig"),
		"--scheduler-kubeconfig=" + filepath.Join(c.dataDir, "scheduler.kubeconfig"),
		"--node-name=" + nodeName,
		"--address=127.0.0.1",
		fmt.Sprintf("--port=%d", ports["kubelet"]),
		"--tls-cert-file=" + node.Cert,
		"--tls-private-key-file=" + node.Key,
		"--root-dir=" + filepath.Join(c.dataDir, "kubelet"),
		"--api-server=" + c.server,
	}, c.opts.kubeletArgs...)
	if err := c.spawnBinary("kubelet", c.opts.kubelet, kubeletArgs); err != nil {
		return err
	}
	if err := c.poll(ctx, "Node "+nodeName+" to be Ready", func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	tKubelet := time.Since(t)

	if err := writeAtomically(c.opts.kubeconfig, c.adminCfg); err != nil {
		return fmt.Errorf("write the kubeconfig: %w", err)
	}
	crdsPart, capiPart := "", ""
	if tCRDs > 0 {
		crdsPart = fmt.Sprintf(", CRDs %.1fs", tCRDs.Seconds())
	}
	if capi != nil {
		capiPart = fmt.Sprintf(", Cluster API's other objects %.1fs and manager %.1fs", tComponents.Seconds(), tCAPI.Seconds())
	}
	say("ready in %.1fs (certificates %.1fs, etcd %.1fs, kube-apiserver %.1fs%s, kube-controller-manager %.1fs%s, kubelet and Node Ready %.1fs)",
		time.Since(t0).Seconds(), tPKI.Seconds(), tEtcd.Seconds(), tAPI.Seconds(), crdsPart, tKCM.Seconds(), capiPart, tKubelet.Seconds())
	say("serving %s; kubeconfig written to %s", c.server, c.opts.kubeconfig)
	return nil
}

func writeAtomically(path string, data []byte) error {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (c *cluster) client() (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(c.adminCfg)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "captf-envtest"
	return kubernetes.NewForConfig(cfg)
}

// spawn starts this program's subcommand name as a child process.
func (c *cluster) spawn(name string, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return c.spawnBinary(name, self, append([]string{name}, args...))
}

func (c *cluster) spawnBinary(name, bin string, args []string) error {
	return c.spawnBinaryEnv(name, bin, args, nil)
}

// spawnBinaryEnv starts bin as the component name, with env (nil: this program's).
func (c *cluster) spawnBinaryEnv(name, bin string, args, env []string) error {
	logPath := filepath.Join(c.dataDir, "logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	ch := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	c.mu.Lock()
	c.children = append(c.children, ch)
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		close(ch.done)
		c.mu.Lock()
		stopping := c.stopping
		c.mu.Unlock()
		if !stopping {
			c.died <- fmt.Sprintf("%s exited (%v); the last lines of %s:\n%s", name, err, logPath, tail(logPath, 30))
		}
	}()
	return nil
}

func tail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var all []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		all = append(all, s.Text())
		if len(all) > lines {
			all = all[1:]
		}
	}
	return strings.Join(all, "\n")
}

// poll checks every 100 ms until check says done, the timeout passes or a component dies.
func (c *cluster) poll(ctx context.Context, what string, check func() (bool, error)) error {
	deadline := time.Now().Add(c.opts.readyTimeout)
	for {
		done, err := check()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (logs in %s)", c.opts.readyTimeout, what, filepath.Join(c.dataDir, "logs"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitHTTP waits until url answers 200, with the admin's client certificate when asAdmin.
func (c *cluster) waitHTTP(ctx context.Context, name, url string, asAdmin bool) error {
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(c.pki.CAFile())
	if err != nil {
		return err
	}
	pool.AppendCertsFromPEM(ca)
	tlsCfg := &tls.Config{RootCAs: pool}
	if asAdmin {
		pair, err := tls.LoadX509KeyPair(c.pki.path("admin.crt"), c.pki.path("admin.key"))
		if err != nil {
			return err
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	return c.poll(ctx, name+" to be ready ("+url+")", func() (bool, error) {
		resp, err := hc.Get(url)
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// stop stops the kubelet first (it kills the Pods' processes), then the controllers,
// the API server and etcd.
func (c *cluster) stop() {
	c.mu.Lock()
	c.stopping = true
	children := append([]*child(nil), c.children...)
	c.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		ch := children[i]
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ch.done:
		case <-time.After(30 * time.Second):
			say("%s did not stop within 30s of SIGTERM: killing it", ch.name)
			_ = syscall.Kill(-ch.cmd.Process.Pid, syscall.SIGKILL)
			<-ch.done
		}
	}
	if c.etcd != nil {
		c.etcd.stop()
	}
	if c.tempData && !c.opts.keepData {
		_ = os.RemoveAll(c.dataDir)
	}
}

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
