// tidemq console: the one script. Body tabs (text / JSON / hex) of a message view.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const tabs of document.querySelectorAll("[data-tabs]")) {
    const section = tabs.parentElement;
    for (const button of tabs.querySelectorAll("button[data-tab]")) {
      button.addEventListener("click", () => {
        for (const b of tabs.querySelectorAll("button")) b.classList.toggle("on", b === button);
        for (const pre of section.querySelectorAll("pre[data-body]")) {
          pre.hidden = pre.dataset.body !== button.dataset.tab;
        }
      });
    }
  }
});
