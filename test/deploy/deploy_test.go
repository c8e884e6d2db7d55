// Package deploy checks the files under deploy/ against each other and against the code: the
// compose file's services and the references between them, the Grafana dashboard's panels, the
// Prometheus alert rules, and the Kubernetes Deployment's shutdown arithmetic. Every metric
// name a dashboard query or an alert uses must be one the code exports. PromQL syntax and the
// Kubernetes schemas are checked by promtool and kubeconform in `make lint`.
package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// root is the repository root, relative to this package's folder.
const root = "../.."

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Build       *struct{ Context, Dockerfile string }
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   any               `yaml:"depends_on"`
}

// dependencies returns the services s depends on, in either of compose's two forms.
func (s composeService) dependencies(t *testing.T) []string {
	switch d := s.DependsOn.(type) {
	case nil:
		return nil
	case []any:
		var names []string
		for _, n := range d {
			names = append(names, fmt.Sprint(n))
		}
		return names
	case map[string]any:
		var names []string
		for n, cond := range d {
			c, _ := cond.(map[string]any)["condition"].(string)
			if !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, c) {
				t.Errorf("depends_on %s: condition %q is not one compose knows", n, c)
			}
			names = append(names, n)
		}
		return names
	default:
		t.Fatalf("depends_on: got %T, want a list or a map", d)
		return nil
	}
}

// listenPort returns the port of a `--listen HOST:PORT` flag in a command.
func listenPort(t *testing.T, command []string) string {
	i := slices.Index(command, "--listen")
	if i < 0 || i+1 >= len(command) {
		t.Fatalf("command %q: no --listen", command)
	}
	_, port, err := net.SplitHostPort(command[i+1])
	if err != nil {
		t.Fatalf("command %q: %v", command, err)
	}
	return port
}

// gatewayConfig is the part of usher.yaml these checks read.
type gatewayConfig struct {
	Server struct {
		Listen         string `yaml:"listen"`
		ShutdownSettle string `yaml:"shutdown_settle"`
		ShutdownGrace  string `yaml:"shutdown_grace"`
	} `yaml:"server"`
	Routing struct {
		Health struct {
			Path string `yaml:"path"`
		} `yaml:"health"`
		Workers []struct {
			ID  string `yaml:"id"`
			URL string `yaml:"url"`
		} `yaml:"workers"`
	} `yaml:"routing"`
	Redis struct {
		URL string `yaml:"url"`
	} `yaml:"redis"`
}

func hostPort(t *testing.T, rawURL string) (string, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("%q: %v", rawURL, err)
	}
	return u.Hostname(), u.Port()
}

func TestComposeServicesAndReferences(t *testing.T) {
	var c composeFile
	readYAML(t, "deploy/compose.yaml", &c)

	gateways := []string{"gateway-1", "gateway-2"}
	workers := []string{"worker-1", "worker-2", "worker-3"}
	want := slices.Concat(gateways, workers, []string{"redis", "postgres", "prometheus", "grafana"})
	for _, name := range want {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("service %s: missing", name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for name, s := range c.Services {
		for _, dep := range s.dependencies(t) {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("%s: depends on %q, which is no service", name, dep)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(filepath.Join(root, "deploy", src)); err != nil {
					t.Errorf("%s: volume %q: %v", name, v, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s: volume %q is neither a file beside compose.yaml nor a named volume", name, v)
			}
		}
		if s.Build != nil {
			if _, err := os.Stat(filepath.Join(root, "deploy", s.Build.Context, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: build: %v", name, err)
			}
		}
	}

	// The gateways read compose/usher.yaml: its workers, Redis and listen port are services here.
	var cfg gatewayConfig
	readYAML(t, "deploy/compose/usher.yaml", &cfg)
	_, gatewayPort, err := net.SplitHostPort(cfg.Server.Listen)
	if err != nil {
		t.Fatalf("compose/usher.yaml server.listen: %v", err)
	}
	var workerURLs []string
	for _, w := range cfg.Routing.Workers {
		host, port := hostPort(t, w.URL)
		s, ok := c.Services[host]
		if !ok {
			t.Errorf("compose/usher.yaml worker %s: host %q is no service", w.ID, host)
			continue
		}
		if !slices.Equal(s.Command[:1], []string{"sim"}) {
			t.Errorf("service %s: command %q, want usher sim", host, s.Command)
		}
		if got := listenPort(t, s.Command); got != port {
			t.Errorf("worker %s: gateway dials port %s, sim listens on %s", w.ID, port, got)
		}
		workerURLs = append(workerURLs, w.URL)
	}
	if got, want := len(workerURLs), len(workers); got != want {
		t.Errorf("compose/usher.yaml: got %d workers, want %d", got, want)
	}
	if host, _ := hostPort(t, cfg.Redis.URL); host != "redis" {
		t.Errorf("compose/usher.yaml redis.url: host %q, want the redis service", host)
	}

	for _, g := range gateways {
		s := c.Services[g]
		if !slices.Equal(s.Command, []string{"serve", "--config", "/etc/usher/usher.yaml"}) {
			t.Errorf("%s: command %q, want serve --config /etc/usher/usher.yaml", g, s.Command)
		}
		if !slices.Contains(s.Volumes, "./compose/usher.yaml:/etc/usher/usher.yaml:ro") {
			t.Errorf("%s: compose/usher.yaml is not mounted at /etc/usher/usher.yaml", g)
		}
		if host, _ := hostPort(t, s.Environment["USHER_DATABASE_URL"]); host != "postgres" {
			t.Errorf("%s: USHER_DATABASE_URL host %q, want the postgres service", g, host)
		}
		if len(s.Environment["USHER_ADMIN_TOKEN"]) == 0 {
			t.Errorf("%s: no USHER_ADMIN_TOKEN", g)
		}
		if len(s.Ports) != 1 || !strings.HasSuffix(s.Ports[0], ":"+gatewayPort) {
			t.Errorf("%s: ports %q, want one mapping to the gateway's port %s", g, s.Ports, gatewayPort)
		}
		deps := s.dependencies(t)
		for _, need := range slices.Concat(workers, []string{"redis", "postgres"}) {
			if !slices.Contains(deps, need) {
				t.Errorf("%s: does not depend on %s", g, need)
			}
		}
	}

	// Prometheus scrapes every gateway and every worker, on the ports they listen on.
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "deploy/prometheus/prometheus.yml", &prom)
	scraped := map[string]string{} // host:port -> job
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				scraped[target] = sc.JobName
			}
		}
	}
	for _, g := range gateways {
		if job := scraped[net.JoinHostPort(g, gatewayPort)]; job != "usher" {
			t.Errorf("prometheus.yml: %s:%s scraped by job %q, want usher (the alerts' job)", g, gatewayPort, job)
		}
	}
	for _, u := range workerURLs {
		host, port := hostPort(t, u)
		if job := scraped[net.JoinHostPort(host, port)]; job != "usher-worker" {
			t.Errorf("prometheus.yml: %s:%s scraped by job %q, want usher-worker", host, port, job)
		}
	}
	for _, f := range prom.RuleFiles {
		mounted := slices.ContainsFunc(c.Services["prometheus"].Volumes, func(v string) bool {
			return strings.HasPrefix(v, "./prometheus/"+f+":")
		})
		if !mounted {
			t.Errorf("prometheus.yml: rule file %s is not mounted into the prometheus service", f)
		}
	}

	// Grafana's provisioned data source is the prometheus service, and the default one, which
	// is what the dashboard's data source variable picks.
	var ds struct {
		Datasources []struct {
			Type      string `yaml:"type"`
			URL       string `yaml:"url"`
			IsDefault bool   `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	readYAML(t, "deploy/grafana/provisioning/datasources/prometheus.yaml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !ds.Datasources[0].IsDefault {
		t.Fatalf("grafana data sources: got %+v, want one, of type prometheus, the default", ds.Datasources)
	}
	if host, _ := hostPort(t, ds.Datasources[0].URL); host != "prometheus" {
		t.Errorf("grafana data source url host %q, want the prometheus service", host)
	}
}

// exportedMetrics returns the metric names the code exports: the usher_* names in the Go
// source outside tests, and the vllm:* names the simulated worker serves.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	literal := regexp.MustCompile(`"((?:usher_|vllm:)[a-z0-9_:]+)"`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllSubmatch(data, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !names["usher_requests_total"] || !names["vllm:num_requests_running"] {
		t.Fatalf("found no metric names in the source (got %d)", len(names))
	}
	return names
}

var metricName = regexp.MustCompile(`\b(?:usher_|vllm:)[a-z0-9_:]+`)

// unknownMetrics returns the usher_* and vllm:* names in a PromQL expression that the code
// does not export (histogram series count as their histogram's name).
func unknownMetrics(expr string, known map[string]bool) []string {
	var unknown []string
	for _, name := range metricName.FindAllString(expr, -1) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name, Type string
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type, UID string
		} `json:"datasource"`
		GridPos struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func TestDashboardPanelsUseExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "deploy/grafana/usher-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("usher-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("templating: no data source variable named datasource")
	}

	known := exportedMetrics(t)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if ids[p.ID] {
			t.Errorf("%s: id used twice", name)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", name, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want uid ${datasource}", name, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", name)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("%s: refId %q empty or used twice", name, q.RefID)
			}
			refs[q.RefID] = true
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("%s %s: empty expr", name, q.RefID)
			}
			if u := unknownMetrics(q.Expr, known); len(u) > 0 {
				t.Errorf("%s %s: metrics %q are not exported by the code", name, q.RefID, u)
			}
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				used[m] = true
			}
		}
	}

	// What the dashboard is for: traffic, TTFT, queue wait per class, shed reasons, worker load
	// and cache hits, per-tenant tokens.
	for _, m := range []string{
		"usher_requests_total", "usher_time_to_first_token_seconds_bucket", "usher_queue_wait_seconds_bucket",
		"usher_queue_shed_total", "usher_routing_worker_in_flight_requests", "usher_routing_worker_reported_kv_usage",
		"usher_routing_cached_tokens_total", "usher_routing_prompt_tokens_total", "usher_queue_tokens_served_total",
	} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

func TestAlertRules(t *testing.T) {
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, "deploy/prometheus/alerts.yaml", &rules)
	known := exportedMetrics(t)
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without a name", g.Name)
				continue
			}
			seen[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			if u := unknownMetrics(r.Expr, known); len(u) > 0 {
				t.Errorf("%s: metrics %q are not exported by the code", r.Alert, u)
			}
		}
	}
	for _, a := range []string{"UsherNoHealthyWorker", "UsherHigh5xxRate", "UsherTTFTP99High", "UsherInteractiveQueueWaitHigh",
		"UsherQueueShedding", "UsherWorkerCircuitOpen", "UsherRedisFallbacks"} {
		if !seen[a] {
			t.Errorf("alert %s: missing", a)
		}
	}
}

// The pod's stop must fit in terminationGracePeriodSeconds: preStop sleep, then the gateway's
// settle and grace (see the comment at the top of deployment.yaml).
func TestKubernetesShutdownFitsGracePeriod(t *testing.T) {
	var dep struct {
		Spec struct {
			Replicas int `yaml:"replicas"`
			Template struct {
				Spec struct {
					TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
					Containers                    []struct {
						Lifecycle struct {
							PreStop struct {
								Sleep *struct {
									Seconds int `yaml:"seconds"`
								} `yaml:"sleep"`
								Exec any `yaml:"exec"`
							} `yaml:"preStop"`
						} `yaml:"lifecycle"`
						ReadinessProbe struct {
							HTTPGet struct{ Path string } `yaml:"httpGet"`
						} `yaml:"readinessProbe"`
						LivenessProbe struct {
							HTTPGet struct{ Path string } `yaml:"httpGet"`
						} `yaml:"livenessProbe"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	readYAML(t, "deploy/kubernetes/base/deployment.yaml", &dep)
	var cfg gatewayConfig
	readYAML(t, "deploy/kubernetes/base/usher.yaml", &cfg)

	pod := dep.Spec.Template.Spec
	if dep.Spec.Replicas < 2 {
		t.Errorf("replicas: got %d, want 2 or more", dep.Spec.Replicas)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: got %d, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if got := c.LivenessProbe.HTTPGet.Path; got != "/healthz" {
		t.Errorf("liveness probe path: got %q, want /healthz", got)
	}
	if got := c.ReadinessProbe.HTTPGet.Path; got != "/readyz" {
		t.Errorf("readiness probe path: got %q, want /readyz", got)
	}
	if c.Lifecycle.PreStop.Exec != nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("preStop: want the sleep action (the image has no shell for exec)")
	}
	duration := func(field, v string, def time.Duration) time.Duration {
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		return d
	}
	preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	settle := duration("server.shutdown_settle", cfg.Server.ShutdownSettle, 5*time.Second)
	grace := duration("server.shutdown_grace", cfg.Server.ShutdownGrace, 30*time.Second)
	if preStop < 3*time.Second {
		t.Errorf("preStop sleep %v: shorter than endpoint propagation usually takes", preStop)
	}
	budget := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second
	if need := preStop + settle + grace; budget <= need {
		t.Errorf("terminationGracePeriodSeconds %v: want more than preStop %v + settle %v + grace %v = %v",
			budget, preStop, settle, grace, need)
	}
}
