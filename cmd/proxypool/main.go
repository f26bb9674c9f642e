// Command proxypool is the standalone appliance and the operator CLI:
//
//	proxypool run --config FILE       controller, checker and gateway in one process
//	proxypool config check FILE       validate a configuration (exit 1 on errors)
//	proxypool plugin list [--dir D]   list provider plugins
//	proxypool plugin test NAME ...    dry-run a plugin against a recorded response
//	proxypool version
//
// This package is wiring only: flags, config, construction, Run.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/version"
)

const defaultConfigPath = "/etc/proxypool/proxypool.yaml"

func main() {
	os.Exit(runCLI(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  proxypool run [--config FILE]
  proxypool config check FILE
  proxypool plugin list [--dir DIR]
  proxypool plugin test NAME --response FILE [--param k=v ...] [--dir DIR] [--status N]
  proxypool version
`

func runCLI(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(stderr)
		path := fs.String("config", defaultConfigPath, "configuration file")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if err := run(*path, stderr); err != nil {
			fmt.Fprintln(stderr, "proxypool:", err)
			return 1
		}
		return 0
	case "config":
		if len(args) != 3 || args[1] != "check" {
			fmt.Fprint(stderr, usage)
			return 2
		}
		return configCheck(args[2], stdout, stderr)
	case "plugin":
		return pluginCmd(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "proxypool", version.Version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "proxypool: unknown command %q\n%s", args[0], usage)
	return 2
}

// configCheck prints every problem with the file and exits 1, or "ok".
func configCheck(path string, stdout, stderr io.Writer) int {
	c, err := config.Load(path)
	if err != nil {
		var errs config.Errors
		if errors.As(err, &errs) {
			fmt.Fprintf(stderr, "%s: %d errors\n", path, len(errs))
			for _, e := range errs {
				fmt.Fprintln(stderr, "  "+e.Error())
			}
		} else {
			fmt.Fprintln(stderr, err)
		}
		return 1
	}
	if err := checkPlugins(c); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok (%d upstreams, %d routings)\n", path, len(c.Upstreams), len(c.Routings))
	return 0
}
