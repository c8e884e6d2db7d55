package test

import (
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/test/redistest"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

// TestServeSharesFairShareInRedis: `usher serve` with redis.url keeps its queues' fair-share
// counters in that Redis, where the other replicas read them: a served tenant's counter appears
// there, under a key that names neither the tenant nor the model in clear.
func TestServeSharesFairShareInRedis(t *testing.T) {
	rs := redistest.Start(t)
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.01
	_, worker := simtest.Start(t, cfg)
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "usher.db")
	gw := startServe(t, "usher serve", func(listen string) string {
		return fleetConfig(listen, rs.Addr(), dbURL, []string{worker.URL})
	})
	for i := range 3 {
		resp, out := fleetCall(t, "POST", gw.url+"/v1/chat/completions", fleetLoadKey, chat("hello", 2, false), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, out)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	eventually(t, 5*time.Second, "a fair-share counter above 0 in Redis", func() bool {
		keys, err := rdb.Keys(ctx, "usher:fair:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.Contains(k, "load") || strings.Contains(k, model) {
				t.Fatalf("key %q names the tenant or the model in clear", k)
			}
			if strings.HasSuffix(k, ":floors") {
				continue
			}
			v, err := strconv.ParseFloat(rdb.Get(ctx, k).Val(), 64)
			if err == nil && v > 0 {
				return true
			}
		}
		return false
	})
}
