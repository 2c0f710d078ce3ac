package ports

import "testing"

// Many ports handed out, none bound: each is handed out once.
func TestAPortIsNotHandedOutTwiceWhileClaimed(t *testing.T) {
	Dir = t.TempDir()
	seen := map[int]bool{}
	for i := 0; i < 3000; i++ {
		p, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if p < low || p >= low+span {
			t.Fatalf("port %d outside %d..%d", p, low, low+span-1)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice (after %d ports)", p, i)
		}
		seen[p] = true
	}
}
