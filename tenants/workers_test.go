package tenants

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The stored workers and console sessions, on both dialects.
func TestStoreWorkersAndSessions(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Run("workers", func(t *testing.T) { testStoreWorkers(t, d.open(t)) })
			t.Run("sessions", func(t *testing.T) { testStoreSessions(t, d.open(t)) })
		})
	}
}

func testStoreWorkers(t *testing.T, s *Store) {
	ctx := context.Background()
	if err := s.CreateWorker(ctx, "w1", []byte(`{"id":"w1"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateWorker(ctx, "w1", []byte(`{"id":"w1"}`)); !errors.Is(err, ErrConflict) {
		t.Fatalf("create a taken id: got %v, want ErrConflict", err)
	}
	if err := s.UpdateWorker(ctx, "w1", []byte(`{"id":"w1","url":"x"}`)); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"update": s.UpdateWorker(ctx, "nope", []byte(`{}`)),
		"delete": s.DeleteWorker(ctx, "nope"),
	} {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s of an unknown worker: got %v, want ErrNotFound", name, err)
		}
	}
	ws, err := s.Workers(ctx)
	if err != nil || len(ws) != 1 || string(ws[0].Spec) != `{"id":"w1","url":"x"}` {
		t.Fatalf("workers: got %+v, %v; want w1 as updated", ws, err)
	}
	if err := s.DeleteWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Workers(ctx); len(ws) != 0 {
		t.Fatalf("workers after delete: got %+v, want none", ws)
	}
}

func testStoreSessions(t *testing.T, s *Store) {
	ctx := context.Background()
	now := time.UnixMilli(time.Now().UnixMilli())
	open := func(id, key string, expires time.Time) {
		t.Helper()
		err := s.CreateAdminSession(ctx, AdminSession{IDHash: id, KeyID: key, Role: "admin", Remote: "192.0.2.1",
			UserAgent: "test", Created: now, Expires: expires, LastSeen: now})
		if err != nil {
			t.Fatal(err)
		}
	}
	open("a", "k1", now.Add(time.Hour))
	open("b", "k1", now.Add(-time.Second)) // expired
	open("c", "k0", now.Add(time.Hour))    // other tokens
	got, err := s.AdminSessions(ctx, "k1", now)
	if err != nil || len(got) != 1 || got[0].IDHash != "a" || !got[0].Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("sessions of k1: got %+v, %v; want a only", got, err)
	}
	if err := s.TouchAdminSession(ctx, "a", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if a, err := s.AdminSession(ctx, "a"); err != nil || !a.LastSeen.Equal(now.Add(time.Minute)) {
		t.Fatalf("touched session: got %+v, %v", a, err)
	}
	if err := s.PruneAdminSessions(ctx, "k1", now); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "c"} {
		if _, err := s.AdminSession(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("session %s after prune: got %v, want ErrNotFound", id, err)
		}
	}
	if err := s.DeleteAdminSession(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAdminSession(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("end an ended session: got %v, want ErrNotFound", err)
	}
}
