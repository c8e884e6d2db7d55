package routing

import (
	"context"
	"strings"
	"testing"
)

// TestAdminWorkersAtMetadataAddressesAreRefused is issue 26's weak spot: the admin API accepted
// worker URLs at link-local metadata addresses, so whoever may add workers could have usher's
// health checks, scrapes and proxy read the cloud's instance credentials. They are refused by
// default, in every spelling a resolver reads as such an address, unless the config allows them.
func TestAdminWorkersAtMetadataAddressesAreRefused(t *testing.T) {
	refused := []string{
		"http://169.254.169.254/",
		"http://169.254.169.254:80/v1",
		"http://169.254.0.1",
		"http://[fe80::1]:8000",
		"http://[fe80::a%25eth0]:8000",
		"http://[::ffff:169.254.169.254]/",
		"http://[fd00:ec2::254]/",
		"http://100.100.100.200/",
		"http://2852039166/",          // 169.254.169.254 as one number
		"http://0xa9fea9fe/",          // in hexadecimal
		"http://0251.0376.0251.0376/", // in octal
		"http://169.254.43518/",       // a.b.c
		"http://metadata.google.internal/computeMetadata/v1",
		"http://METADATA.google.internal./",
		"http://metadata/",
		"https://instance-data.ec2.internal/",
	}
	allowed := []string{"http://10.0.0.7:8000", "http://127.0.0.1:8000", "https://gpu-1.example.com", "http://[2001:db8::1]:8000",
		"http://169.255.0.1/", "http://1e100.net/", "http://0x.example/"}
	p, err := NewPool(Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	open, err := NewPool(Config{AllowLinkLocalWorkers: true}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, u := range refused {
		spec := WorkerSpec{ID: "w" + string(rune('a'+i)), URL: u, Models: []string{"m"}}
		if err := p.AddWorker(ctx, spec); err == nil || !strings.Contains(err.Error(), "worker.url") ||
			!strings.Contains(err.Error(), "allow_link_local_workers") {
			t.Errorf("add %s: got %v, want refused naming worker.url and the switch", u, err)
		}
		if err := open.AddWorker(ctx, spec); err != nil {
			t.Errorf("add %s with allow_link_local_workers: got %v, want added", u, err)
		}
	}
	for i, u := range allowed {
		if err := p.AddWorker(ctx, WorkerSpec{ID: "ok" + string(rune('a'+i)), URL: u, Models: []string{"m"}}); err != nil {
			t.Errorf("add %s: got %v, want added", u, err)
		}
	}
	if err := p.UpdateWorker(ctx, WorkerSpec{ID: "oka", URL: "http://169.254.169.254/", Models: []string{"m"}}); err == nil {
		t.Error("change a worker's URL to 169.254.169.254: got nil, want refused")
	}
}
