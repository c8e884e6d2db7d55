package test

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/test/testlog"
)

// defaultClientTimeout bounds every request the tests make through http.DefaultClient
// (http.Get, http.Post): no test waits that long for an answer, so a call the gateway never
// answers fails its own test, by name, instead of hanging the package until go test's timeout.
const defaultClientTimeout = 2 * time.Minute

// TestMain keeps the Redis client's own log lines (dial errors while a test has Redis down, by
// design) out of the output unless -v: they go to a file of testlog.Dir, named at the end. It
// bounds http.DefaultClient (defaultClientTimeout).
func TestMain(m *testing.M) {
	flag.Parse()
	http.DefaultClient.Timeout = defaultClientTimeout
	var redisLog *testlog.File
	if !testing.Verbose() {
		redisLog = testlog.NewFile("redis-client.log")
		redis.SetLogger(redisLog)
	}
	code := m.Run()
	if redisLog != nil {
		if path, written := redisLog.Close(); written {
			fmt.Printf("the Redis client's log of this run: %s\n", path)
		}
	}
	os.Exit(code)
}
