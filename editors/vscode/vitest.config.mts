import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

// The extension module imports `vscode`, which only exists inside the editor: tests get a fake.
export default defineConfig({
  resolve: { alias: { vscode: fileURLToPath(new URL("./test/fake-vscode.ts", import.meta.url)) } },
  test: { include: ["test/**/*.test.ts"], environment: "node" },
});
