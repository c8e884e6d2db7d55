package main

import (
	"runtime/debug"
	"testing"
)

func TestVersionLine(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	tests := []struct {
		name   string
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"no build information", "", nil, "usher (devel)"},
		{"linked version only", "v1.2.3", nil, "usher v1.2.3"},
		{"go run", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, "usher (devel) (go1.26.8)"},
		{
			"go install of a tag", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.4.0"}},
			"usher v0.4.0 (go1.26.8)",
		},
		{
			"go build in a modified checkout", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261123165221-200d3dd5ab12+dirty"},
				Settings: vcs("vcs.revision", "200d3dd5ab12cafe0123456789abcdef01234567", "vcs.time", "2026-11-23T16:52:21Z", "vcs.modified", "true")},
			"usher v0.0.0-20261123165221-200d3dd5ab12+dirty (commit 200d3dd5ab12, modified, 2026-11-23T16:52:21Z, go1.26.8)",
		},
		{
			"make build: the linked version wins", "v0.4.0-3-g200d3dd",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs("vcs.revision", "200d3dd")},
			"usher v0.4.0-3-g200d3dd (commit 200d3dd, go1.26.8)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionLine(tt.linked, tt.info); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
