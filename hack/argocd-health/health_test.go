// Runs the Argo CD health checks under config/argocd the way Argo CD does: the same Lua VM
// (gopher-lua), the object as a Lua table in the global `obj`, the script's returned table
// read as {status, message}. Test cases use Argo CD's own layout: health_test.yaml listing
// inputPath and expected healthStatus, as in argo-cd/resource_customizations.
package argocdhealth

import (
	"os"
	"path/filepath"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type testFile struct {
	Tests []struct {
		HealthStatus healthStatus `json:"healthStatus"`
		InputPath    string       `json:"inputPath"`
	} `json:"tests"`
}

func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch v := v.(type) {
	case map[string]interface{}:
		t := l.NewTable()
		for k, item := range v {
			t.RawSetString(k, toLua(l, item))
		}
		return t
	case []interface{}:
		t := l.NewTable()
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case string:
		return lua.LString(v)
	case float64:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	default:
		return lua.LNil
	}
}

func TestHealthChecks(t *testing.T) {
	dirs, err := filepath.Glob("../../config/argocd/*/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no health checks found under config/argocd (%v)", err)
	}
	for _, dir := range dirs {
		script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var cases testFile
		if err := yaml.Unmarshal(raw, &cases); err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases.Tests {
			t.Run(dir+"/"+tc.InputPath, func(t *testing.T) {
				input, err := os.ReadFile(filepath.Join(dir, tc.InputPath))
				if err != nil {
					t.Fatal(err)
				}
				var obj map[string]interface{}
				if err := yaml.Unmarshal(input, &obj); err != nil {
					t.Fatal(err)
				}
				l := lua.NewState(lua.Options{SkipOpenLibs: false})
				defer l.Close()
				l.SetGlobal("obj", toLua(l, obj))
				if err := l.DoString(string(script)); err != nil {
					t.Fatalf("health.lua failed: %v", err)
				}
				ret, ok := l.Get(-1).(*lua.LTable)
				if !ok {
					t.Fatalf("health.lua returned %v, not a table", l.Get(-1))
				}
				got := healthStatus{Status: ret.RawGetString("status").String(), Message: ret.RawGetString("message").String()}
				if got != tc.HealthStatus {
					t.Errorf("got %+v, want %+v", got, tc.HealthStatus)
				}
			})
		}
	}
}
