package test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/test/testlog"
)

// TestMain keeps the Redis client's own log lines (dial errors while a test has Redis down, by
// design) out of the output unless -v: they go to a file of testlog.Dir, named at the end.
func TestMain(m *testing.M) {
	flag.Parse()
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
